"""Token counts from the engine's own ``usage`` fields, found cheaply and read within bounds.

Parsing every streamed chunk as JSON would cost more CPU than relaying it. TokenUsage only ever
appears in the last events of a stream (the usage chunk before ``[DONE]``, or llama.cpp's finish
chunk in completions streams) and once in a non-streamed body, so the gateway keeps only a tail
of the stream and decodes the last ``"usage"`` object it finds there.

An engine's counts are charged to quotas and written to the store, so they are read here, in
one place (``read_usage``), as what they must be: integers, at least 0 and at most what the
request could have produced (``usage_bounds``). A count outside those bounds is clamped to them
and the clamp travels with the usage (``TokenUsage.clamped``) for the access log's warning and
the ``llmgw_usage_clamped_total`` metric; a count of the wrong type is no usage at all, and the
gateway charges its estimate as it does for an engine that reports none.
"""

from __future__ import annotations

import json
from typing import Any, TypeGuard

import attrs

from .requests import ParsedRequest

TAIL_BYTES = 16 * 1024
_decoder = json.JSONDecoder()

# No request produces more tokens than this, of either kind: 2**24 (16.8 million) is above the
# longest context of any model (10 million, Llama 4 Scout), so no real count is clamped by it,
# and a day of such requests still sums far below the store's 2**62 per row. It is the bound
# where the request says nothing better (no max_tokens; images or audio in the prompt).
TOKEN_CAP = 2**24
# Prompt tokens per byte of a text-only request body. Byte-level BPE (the GGUF models llama.cpp
# serves, most HF tokenizers) makes at most one token of each byte of text, and JSON spends at
# least a byte on each; a tokenizer that normalises (NFKC) can turn one 3-byte character into
# 18 (U+FDFA), 33 bytes that byte fallback makes 33 tokens: 11 a byte is that worst case.
_PROMPT_TOKENS_PER_BYTE = 11
# What a chat template adds of its own besides the messages' text (role markers, a default
# system prompt, the date, tool instructions): a few hundred tokens in the templates we know.
_TEMPLATE_TOKENS = 4096
# How much of a clamped count a log line shows: a hostile integer may have thousands of digits.
_SHOWN_DIGITS = 24


@attrs.frozen
class UsageBounds:
    """The most tokens of each kind one request could have produced."""

    prompt: int = TOKEN_CAP
    completion: int = TOKEN_CAP


# For a caller that knows nothing of the request: the absolute cap alone.
ABSOLUTE = UsageBounds()


@attrs.frozen
class Clamp:
    """A count an engine reported outside its bounds, and what was taken instead."""

    field: str
    reported: int
    taken: int

    def describe(self) -> str:
        shown = str(self.reported) if abs(self.reported) < 10**_SHOWN_DIGITS else f"~2**{self.reported.bit_length()}"
        return f"{self.field}={shown} taken as {self.taken}"


@attrs.frozen
class TokenUsage:
    """The token counts an engine reported for one response (its ``usage`` fields)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of prompt_tokens, those the engine took from its KV cache (prompt_tokens_details.cached_tokens).
    cached_tokens: int = 0
    # The counts that were out of bounds and clamped (empty for a sane engine).
    clamped: tuple[Clamp, ...] = ()


def usage_bounds(request: ParsedRequest, prefill_bytes: int = 0, context: int | None = None) -> UsageBounds:
    """What ``request`` could have produced: its text's tokens, and ``max_tokens`` for each choice.

    ``prefill_bytes``: text added to the prompt beyond the request body (a continued stream's
    text so far, gateway/continuation.py). ``context``: the tokens one request may hold on the
    replica, when its engine said (llama-server's per-slot ``n_ctx``): no prompt is longer.
    """
    payload = request.payload
    kind = request.endpoint.kind
    prompt = TOKEN_CAP
    if _text_only(kind, payload):
        prompt = min(TOKEN_CAP, (len(request.body) + prefill_bytes) * _PROMPT_TOKENS_PER_BYTE + _TEMPLATE_TOKENS)
    if context is not None and context > 0:
        prompt = min(prompt, context)
    if kind == "embeddings":
        return UsageBounds(prompt, 0)
    if not request.endpoint.metered:
        return UsageBounds(prompt, 0)
    # The endpoint names where its request gives an output budget (max_tokens, max_output_tokens...).
    limits = [v for v in (payload.get(name) for name in request.endpoint.max_output) if _count(v) and v > 0]
    if not limits:
        return UsageBounds(prompt, TOKEN_CAP)
    # Each choice may use all of max_tokens; vLLM's best_of generates more than it returns.
    choices = max([1] + [v for v in (payload.get("n"), payload.get("best_of")) if _count(v)])
    return UsageBounds(prompt, min(TOKEN_CAP, max(limits) * choices))


def _count(value: object) -> TypeGuard[int]:
    # bool is an int in Python, but true is no count.
    return isinstance(value, int) and not isinstance(value, bool)


def _text_only(kind: str, payload: dict[str, Any]) -> bool:
    """Whether the prompt is text (strings, token ids, text parts): no image, audio or file whose
    tokens its bytes say nothing about."""
    if kind in ("chat", "messages"):
        for message in payload.get("messages") or ():
            if not isinstance(message, dict):
                return False
            content = message.get("content")
            if isinstance(content, list):
                if not all(isinstance(part, dict) and part.get("type") in ("text", "input_text") for part in content):
                    return False
            elif not (content is None or isinstance(content, str)):
                return False
        return True
    if kind in ("completions", "embeddings"):
        value = payload.get("prompt" if kind == "completions" else "input")
        items = value if isinstance(value, list) else [value]
        return all(
            isinstance(item, str | int) or (isinstance(item, list) and all(isinstance(i, int) for i in item))
            for item in items
        )
    return False


def _clamp(field: str, value: int, bound: int, clamped: list[Clamp]) -> int:
    taken = min(max(value, 0), bound)
    if taken != value:
        clamped.append(Clamp(field, value, taken))
    return taken


@attrs.frozen
class _Counts:
    """What one ``usage`` object says; None where it says nothing (a Messages ``message_delta``
    carries only ``output_tokens``). Raw: bounds are applied once, in ``_usage``."""

    prompt: int | None
    completion: int | None
    cached: int | None


def _int(value: object) -> int | None:
    return value if _count(value) else None


def _counts(value: dict[str, object]) -> _Counts | None:
    """The counts of a usage object in any of the shapes the engines answer in, or None.

    OpenAI chat, completions, embeddings and rerank: ``prompt_tokens``/``completion_tokens``
    (``prompt_tokens_details.cached_tokens`` of the prompt). OpenAI Responses:
    ``input_tokens``/``output_tokens`` (``input_tokens_details.cached_tokens`` of the input).
    Anthropic Messages: ``input_tokens``/``output_tokens``, where the input excludes
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens``, so the prompt is their sum.
    A count of the wrong type is no usage at all.
    """
    if "prompt_tokens" in value:
        prompt, completion = _int(value["prompt_tokens"]), _int(value.get("completion_tokens", 0))
        if prompt is None or completion is None:
            return None
        return _Counts(prompt, completion, _cached_tokens(value, prompt))
    if "input_tokens" not in value and "output_tokens" not in value:
        return None
    given, completion = _int(value.get("input_tokens")), _int(value.get("output_tokens"))
    if given is None and completion is None:
        return None
    read, created = _int(value.get("cache_read_input_tokens")), _int(value.get("cache_creation_input_tokens"))
    if given is None or (read is None and created is None):
        # Responses (or a partial Messages usage): the input holds its cached tokens.
        details = value.get("input_tokens_details")
        cached = _sane(details.get("cached_tokens"), given) if isinstance(details, dict) and given else None
        return _Counts(given, completion, cached)
    prompt = given + max(read or 0, 0) + max(created or 0, 0)
    return _Counts(prompt, completion, _sane(read, prompt))


def _counts_at(data: bytes | bytearray, position: int) -> _Counts | None:
    """The counts of the usage object named at ``position`` (where ``"usage"`` is), if it parses."""
    start = data.find(b"{", position + 7, position + 64)
    if start < 0:
        return None
    try:
        text = bytes(data[start : start + 4096]).decode("utf-8", "replace")
        value, _ = _decoder.raw_decode(text)
    except (ValueError, RecursionError):
        # RecursionError: 4 KiB of brackets from an engine nests 2,048 deep, past the C
        # scanner's limit (llmgw_shared.jsonin explains); such a tail simply has no usage.
        # ValueError: also an integer of more than 4,300 digits (Python's own limit).
        return None
    return _counts(value) if isinstance(value, dict) else None


def _last_counts(data: bytes | bytearray, *, whole: bool) -> _Counts | None:
    """The last usage object in ``data`` that parses (with a prompt count when ``whole``)."""
    position = len(data)
    while True:
        position = data.rfind(b'"usage"', 0, position)
        if position < 0:
            return None
        counts = _counts_at(data, position)
        if counts is not None and (counts.prompt is not None or not whole):
            return counts


def _first_counts(data: bytes | bytearray) -> _Counts | None:
    """The first usage object in ``data`` with a prompt count (a Messages stream's message_start)."""
    position = -1
    while True:
        position = data.find(b'"usage"', position + 1)
        if position < 0:
            return None
        counts = _counts_at(data, position)
        if counts is not None and counts.prompt is not None:
            return counts


def _usage(counts: _Counts, data: bytes | bytearray | None, bounds: UsageBounds) -> TokenUsage | None:
    """The usage ``counts`` say, each count clamped into ``bounds`` (the one place bounds apply)."""
    if counts.prompt is None:
        return None
    clamped: list[Clamp] = []
    prompt = _clamp("prompt_tokens", counts.prompt, bounds.prompt, clamped)
    completion = _clamp("completion_tokens", counts.completion or 0, bounds.completion, clamped)
    cached = counts.cached if counts.cached is not None and counts.cached <= prompt else None
    if cached is None and data is not None:
        cached = _timings_cache_n(data, prompt)
    return TokenUsage(prompt, completion, cached or 0, tuple(clamped))


def read_usage(value: object, bounds: UsageBounds = ABSOLUTE) -> TokenUsage | None:
    """The counts of a decoded ``usage`` object (any API's shape) within ``bounds``; None when it
    holds none."""
    counts = _counts(value) if isinstance(value, dict) else None
    return None if counts is None else _usage(counts, None, bounds)


def find_usage(data: bytes | bytearray, bounds: UsageBounds = ABSOLUTE) -> TokenUsage | None:
    """The last well-formed usage object in ``data``, in any API's shape, read within ``bounds``."""
    counts = _last_counts(data, whole=True)
    return None if counts is None else _usage(counts, data, bounds)


def _sane(value: object, prompt: int) -> int | None:
    # An engine's count is trusted only within the prompt it describes: a hostile or broken one
    # must not inflate the cached-token metric past the prompt tokens it is a part of.
    if _count(value) and 0 <= value <= prompt:
        return value
    return None


def _cached_tokens(usage: dict[str, object], prompt: int) -> int | None:
    """``prompt_tokens_details.cached_tokens`` (OpenAI, vLLM, SGLang, llama-server) when sane."""
    details = usage.get("prompt_tokens_details")
    return _sane(details.get("cached_tokens"), prompt) if isinstance(details, dict) else None


def _timings_cache_n(data: bytes | bytearray, prompt: int) -> int | None:
    """llama.cpp's own ``timings.cache_n`` (prompt tokens reused from the slot), for builds whose
    ``usage`` has no ``prompt_tokens_details``: the last ``timings`` object in ``data``."""
    position = data.rfind(b'"timings"')
    start = data.find(b"{", position + 9, position + 64) if position >= 0 else -1
    if start < 0:
        return None
    try:
        value, _ = _decoder.raw_decode(bytes(data[start : start + 4096]).decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    return _sane(value.get("cache_n"), prompt) if isinstance(value, dict) else None


class StreamTail:
    """The last TAIL_BYTES of a relayed stream; with ``head``, also the usage in its first
    TAIL_BYTES (a Messages stream gives its input tokens in ``message_start``, its output tokens
    in the last ``message_delta``). Its usage is read within ``bounds``."""

    def __init__(self, bounds: UsageBounds = ABSOLUTE, *, head: bool = False) -> None:
        self._bounds = bounds
        self._buffer = bytearray()
        self._head: bytearray | None = bytearray() if head else None
        self._start: _Counts | None = None

    def feed(self, chunk: bytes) -> None:
        if self._head is not None:
            self._head += chunk[:TAIL_BYTES]
            if b'"usage"' in self._head:
                self._start = _first_counts(self._head)
            if self._start is not None or len(self._head) >= TAIL_BYTES:
                self._head = None
        self._buffer += chunk
        excess = len(self._buffer) - TAIL_BYTES
        if excess > TAIL_BYTES:
            del self._buffer[:excess]

    def usage(self) -> TokenUsage | None:
        if self._start is None:
            return find_usage(self._buffer, self._bounds)
        last = _last_counts(self._buffer, whole=False) or self._start
        start = self._start
        merged = _Counts(
            last.prompt if last.prompt is not None else start.prompt,
            last.completion if last.completion is not None else start.completion,
            last.cached if last.cached is not None else start.cached,
        )
        return _usage(merged, self._buffer, self._bounds)
