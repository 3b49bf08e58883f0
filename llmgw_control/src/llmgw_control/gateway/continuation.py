"""Streams that survive their replica: what the client has seen, and the continuation spliced in.

When an engine breaks off a stream after bytes reached the client, the gateway sends the request
to another replica with what was already generated -- for chat, the messages plus an assistant
message holding the partial content, which llama-server (b11312) continues as a prefill and whose
first delta echoes it; for completions, the prompt plus the generated text -- with ``max_tokens``
reduced by the tokens already sent. The new stream is rewritten into the old one: same ``id``,
``created`` and ``model``, no second role chunk, the echo cut off, and the usage counted as the
client expects (its prompt, and every token it received).

The relay forwards only whole SSE events while a stream may be continued (``StreamRecord``), so a
cut never leaves half an event at the client, and keeps their bytes: they are parsed only when
the stream breaks, so an unbroken stream pays one copy of its bytes and no JSON.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from llmgw_shared.jsonin import loads as json_loads

from .requests import ParsedRequest
from .usage import TokenUsage, read_usage, usage_bounds

# What a stream may send before it can no longer be continued (the record of it is the memory a
# continuation costs): llama-server's chat events are ~250 bytes a token, so 4 MiB is ~16,000
# tokens, longer than the context of the models this fleet serves by default.
RECORD_LIMIT = 4 * 1024 * 1024
_END = b"\n\n"
# An event longer than this is no engine's (a token's event is a few hundred bytes, the last one
# with usage and timings under 2 KiB): it is passed on as it is rather than held whole, and the
# stream can no longer be continued. It bounds what a hostile engine can make the relay hold.
_EVENT_LIMIT = 1024 * 1024


def _events_end(data: bytes) -> int:
    """Where the complete events in ``data`` end (0: none): after the last blank line."""
    # \r\n line ends are SSE too; the engines we know write \n.
    lf, crlf = data.rfind(_END), data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


_DONE = b"data: [DONE]"
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def may_continue(request: ParsedRequest) -> bool:
    """Whether this request's stream can be continued elsewhere should its engine break off.

    Only one plain choice (``n`` of 1, no logprobs) whose text can be carried over: for chat, a
    conversation that does not already end in an assistant prefill of the client's own; for
    completions, a prompt that is one string, without ``echo`` or ``suffix``.

    Messages and Responses streams are never continued: their events number what they carry
    (content block indexes, item ids, sequence numbers) and their ends hold the usage and the
    whole output again, all of which a splice would have to rewrite. When their engine breaks
    off, the stream ends with an ``event: error`` in the API's shape (the refusal, tested).
    """
    payload = request.payload
    if not request.stream or payload.get("n") not in (None, 1) or payload.get("logprobs"):
        return False
    kind = request.endpoint.kind
    if kind == "chat":
        last = payload["messages"][-1]
        return bool(last.get("role") != "assistant")
    if kind == "completions":
        return isinstance(payload["prompt"], str) and not payload.get("echo") and payload.get("suffix") is None
    return False


@attrs.define
class Seen:
    """What the client has received so far, read from the events relayed to it."""

    id: Any = None
    created: Any = None
    model: Any = None
    text: str = ""
    # Content events: llama-server sends one per token, so this counts the tokens sent.
    tokens: int = 0
    finish_reason: Any = None
    # The chat role chunk reached the client: a continuation's own is dropped.
    role_sent: bool = False
    # Something the continuation cannot carry over (tool calls, reasoning, a second choice).
    other: bool = False


def events(data: bytes | bytearray) -> list[bytes]:
    """The ``data:`` payloads of the complete SSE events in ``data``."""
    found = []
    for block in bytes(data).split(_END):
        for line in block.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                found.append(line[5:].strip())
    return found


def read_seen(data: bytes | bytearray, kind: str) -> Seen:
    seen = Seen()
    for payload in events(data):
        if payload == b"[DONE]":
            continue
        try:
            event = json_loads(payload)
        except ValueError:
            seen.other = True
            continue
        if not isinstance(event, dict):
            continue
        if seen.id is None:
            seen.id, seen.created, seen.model = event.get("id"), event.get("created"), event.get("model")
        if "error" in event:
            seen.other = True
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                seen.other = True
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" in delta:
                seen.role_sent = True
            piece = _piece(choice, kind)
            if piece is None:
                seen.other = True
            elif piece:
                seen.text += piece
                seen.tokens += 1
            if choice.get("finish_reason") is not None:
                seen.finish_reason = choice["finish_reason"]
    return seen


def _piece(choice: dict[str, Any], kind: str) -> str | None:
    """The text a choice adds, or None when it carries something a continuation cannot."""
    if kind == "completions":
        text = choice.get("text", "")
        return text if isinstance(text, str) else None
    delta = choice.get("delta") or {}
    if not isinstance(delta, dict):
        return None
    if any(delta.get(k) for k in ("tool_calls", "function_call", "reasoning_content", "refusal")):
        return None
    content = delta.get("content")
    if content is None:
        return ""  # the role chunk, or the finish chunk
    return content if isinstance(content, str) else None


def ending(request: ParsedRequest, seen: Seen) -> bytes | None:
    """The end of a stream that needs no engine, or None: the client has the whole answer when
    its finish chunk arrived (only ``[DONE]`` is missing), or when every token ``max_tokens``
    allows has reached it (the finish chunk, "length", is the gateway's to send)."""
    if seen.other:
        return None
    if seen.finish_reason is not None:
        return _DONE + _END
    limits = [request.payload.get(name) for name in ("max_tokens", "max_completion_tokens")]
    if not any(isinstance(limit, int) and seen.tokens >= limit for limit in limits):
        return None
    if request.endpoint.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": "length"}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
        kind = "text_completion"
    event = {"id": seen.id, "object": kind, "created": seen.created, "model": seen.model, "choices": [choice]}
    return b"data: " + _dumps(event).encode() + _END + _DONE + _END


def continuation_request(request: ParsedRequest, seen: Seen) -> ParsedRequest | None:
    """The request that continues ``seen``, or None when nothing sensible can be asked."""
    payload = dict(request.payload)
    for name in ("max_tokens", "max_completion_tokens"):
        limit = payload.get(name)
        if isinstance(limit, int):
            if limit - seen.tokens < 1:
                return None
            payload[name] = limit - seen.tokens
    if not seen.text:
        pass  # nothing generated yet (or only the role chunk): the request as the client sent it
    elif request.endpoint.kind == "chat":
        payload["messages"] = [*payload["messages"], {"role": "assistant", "content": seen.text}]
    else:
        payload["prompt"] = payload["prompt"] + seen.text
    # Asked for always: the engines' real counts are what quotas are charged.
    payload["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
    return attrs.evolve(request, body=_dumps(payload).encode(), payload=payload)


class StreamRecord:
    """One client stream across its attempts: the events sent, and what the engines did."""

    def __init__(self, request: ParsedRequest) -> None:
        self.request = request
        self.kind = request.endpoint.kind
        self.sent = bytearray()
        self.overflow = False
        self._held = b""
        # Continuations started, and the prompt and completion tokens of the attempts that broke.
        self.continuations = 0
        self.broken_tokens: list[int] = []
        # The rewriter of the attempt under way, once it is a continuation.
        self.splice: Splice | None = None
        self.client_wants_usage = bool((request.payload.get("stream_options") or {}).get("include_usage"))

    def whole_events(self, data: bytes) -> bytes:
        """The complete events of what arrived (kept), holding back an unfinished one."""
        data = self._held + data if self._held else data
        cut = _events_end(data)
        if len(data) - cut > _EVENT_LIMIT:
            self.overflow, self._held = True, b""
            return data
        if not cut:
            self._held = data
            return b""
        self._held = data[cut:]
        whole = data[:cut]
        if not self.overflow:
            if len(self.sent) + len(whole) > RECORD_LIMIT:
                self.overflow = True
                self.sent = bytearray()
            else:
                self.sent += whole
        return whole

    def rest(self) -> bytes:
        """What is held back, sent as it is when the stream ended cleanly."""
        held, self._held = self._held, b""
        return held

    def seen(self) -> Seen:
        return read_seen(self.sent, self.kind)

    def continue_after(self, seen: Seen) -> None:
        """The next attempt continues what the client has ``seen``: its stream is rewritten."""
        self._held = b""
        self.continuations += 1
        self.broken_tokens.append(seen.tokens)
        self.splice = Splice(self, seen)


class Splice:
    """Rewrites a continuation's SSE stream into the stream the client is reading."""

    def __init__(self, record: StreamRecord, seen: Seen) -> None:
        self.record = record
        self.seen = seen
        self._echo = seen.text if record.kind == "chat" else ""
        self._buffer = b""
        # What the engines did over every attempt, once the last one reported its usage.
        self.charged: TokenUsage | None = None
        # What this attempt could produce: its prompt is the client's plus the text so far.
        self._bounds = usage_bounds(record.request, prefill_bytes=len(seen.text.encode()))

    def feed(self, data: bytes) -> bytes:
        """Rewritten whole events of ``data``; an unfinished event waits for the rest."""
        data = self._buffer + data
        cut = _events_end(data)
        if len(data) - cut > _EVENT_LIMIT:
            self._buffer = b""
            return data
        if not cut:
            self._buffer = data
            return b""
        self._buffer = data[cut:]
        out: list[bytes] = []
        for payload in events(data[:cut]):
            rewritten = self._event(payload)
            if rewritten is not None:
                out.append(b"data: " + rewritten + _END)
        return b"".join(out)

    def rest(self) -> bytes:
        held, self._buffer = self._buffer, b""
        return held

    def _event(self, payload: bytes) -> bytes | None:
        if payload == b"[DONE]":
            return payload
        try:
            event = json_loads(payload)
        except ValueError:
            return payload
        if not isinstance(event, dict):
            return payload
        for name in ("id", "created", "model"):
            value = getattr(self.seen, name)
            if value is not None and name in event:
                event[name] = value
        choices = event.get("choices")
        if isinstance(choices, list):
            kept = [c for c in (self._choice(c) for c in choices) if c is not None]
            if choices and not kept and "usage" not in event:
                return None
            event["choices"] = kept
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
            # Asked for by the gateway, not the client: the usage-only chunk is dropped. Usage on
            # a chunk with choices (llama-server's completions finish chunk) the engine sends
            # unasked, and an unbroken stream would have carried it.
            if not self.record.client_wants_usage and not event["choices"]:
                return None
        return _dumps(event).encode()

    def _choice(self, choice: Any) -> Any:
        """The choice as the client's stream carries it, or None when nothing is left of it."""
        if not isinstance(choice, dict):
            return choice
        if self.record.kind == "completions":
            text = choice.get("text")
            empty = isinstance(text, str) and not text
            return None if empty and choice.get("finish_reason") is None else choice
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return choice
        if self.seen.role_sent:
            delta.pop("role", None)
        text = delta.get("content")
        if isinstance(text, str):
            delta["content"] = text = self._strip_echo(text)
        if not text and not [k for k in delta if k != "content"] and choice.get("finish_reason") is None:
            # Nothing left of it (the echo, or the role chunk): the client would see an empty delta.
            return None
        return choice

    def _strip_echo(self, text: str) -> str:
        """The engine's first deltas repeat the prefill (llama-server b11312 does): cut that off."""
        echo = self._echo
        if not echo:
            return text
        if text.startswith(echo):
            self._echo = ""
            return text[len(echo) :]
        if echo.startswith(text):
            self._echo = echo[len(text) :]
            return ""
        self._echo = ""  # it does not echo after all
        return text

    def _usage(self, usage: dict[str, Any]) -> None:
        counts = read_usage(usage, self._bounds)
        if counts is None:
            return
        prompt, completion = counts.prompt_tokens, counts.completion_tokens
        sent_before = self.seen.tokens
        # The continuation's prompt is the client's plus the tokens it had received (counted as
        # content events, one a token): exact when the text re-tokenizes as it was generated, as an
        # engine's own output nearly always does; the broken attempt never said its prompt's size.
        client_prompt = max(0, prompt - sent_before)
        usage["prompt_tokens"] = client_prompt
        usage["completion_tokens"] = sent_before + completion
        usage["total_tokens"] = client_prompt + sent_before + completion
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if isinstance(details, dict) and isinstance(cached, int):
            # Part of the prompt the client sent: never more than it (the rest was its own output).
            details["cached_tokens"] = max(0, min(cached, client_prompt))
        # Each attempt read the client's prompt and what had been generated before it started.
        starts = [0, *self.record.broken_tokens[:-1]]
        self.charged = TokenUsage(
            sum(client_prompt + s for s in starts) + prompt, sent_before + completion, clamped=counts.clamped
        )
