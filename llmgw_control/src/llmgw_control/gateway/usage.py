"""Token counts from the engine's own ``usage`` fields, found cheaply.

Parsing every streamed chunk as JSON would cost more CPU than relaying it. TokenUsage only ever
appears in the last events of a stream (the usage chunk before ``[DONE]``, or llama.cpp's finish
chunk in completions streams) and once in a non-streamed body, so the router keeps only a tail
of the stream and decodes the last ``"usage"`` object it finds there.
"""

from __future__ import annotations

import json

import attrs

TAIL_BYTES = 16 * 1024
_decoder = json.JSONDecoder()


@attrs.frozen
class TokenUsage:
    """The token counts an engine reported for one response (its ``usage`` fields)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of prompt_tokens, those the engine took from its KV cache (prompt_tokens_details.cached_tokens).
    cached_tokens: int = 0


@attrs.frozen
class _Counts:
    """What one ``usage`` object says; None where it says nothing (a Messages ``message_delta``
    carries only ``output_tokens``)."""

    prompt: int | None
    completion: int | None
    cached: int | None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _counts(value: dict[str, object]) -> _Counts | None:
    """The counts of a usage object in any of the shapes the engines answer in, or None.

    OpenAI chat, completions, embeddings and rerank: ``prompt_tokens``/``completion_tokens``
    (``prompt_tokens_details.cached_tokens`` of the prompt). OpenAI Responses:
    ``input_tokens``/``output_tokens`` (``input_tokens_details.cached_tokens`` of the input).
    Anthropic Messages: ``input_tokens``/``output_tokens``, where the input excludes
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens``, so the prompt is their sum.
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
        text = bytes(data[start:start + 4096]).decode("utf-8", "replace")
        value, _ = _decoder.raw_decode(text)
    except (ValueError, RecursionError):
        # RecursionError: 4 KiB of brackets from an engine nests 2,048 deep, past the C
        # scanner's limit (llmgw_shared.jsonin explains); such a tail simply has no usage.
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


def _usage(counts: _Counts, data: bytes | bytearray) -> TokenUsage | None:
    if counts.prompt is None:
        return None
    cached = counts.cached
    if cached is None:
        cached = _timings_cache_n(data, counts.prompt)
    return TokenUsage(counts.prompt, counts.completion or 0, cached or 0)


def find_usage(data: bytes | bytearray) -> TokenUsage | None:
    """The last well-formed usage object in ``data``, in any API's shape, or None."""
    counts = _last_counts(data, whole=True)
    return None if counts is None else _usage(counts, data)


def _sane(value: object, prompt: int) -> int | None:
    # An engine's count is trusted only within the prompt it describes: a hostile or broken one
    # must not inflate the cached-token metric past the prompt tokens it is a part of.
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= prompt:
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
        value, _ = _decoder.raw_decode(bytes(data[start:start + 4096]).decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    return _sane(value.get("cache_n"), prompt) if isinstance(value, dict) else None


class StreamTail:
    """The last TAIL_BYTES of a relayed stream; with ``head``, also the usage in its first
    TAIL_BYTES (a Messages stream gives its input tokens in ``message_start``, its output tokens
    in the last ``message_delta``)."""

    def __init__(self, *, head: bool = False) -> None:
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
            return find_usage(self._buffer)
        last = _last_counts(self._buffer, whole=False) or self._start
        start = self._start
        merged = _Counts(last.prompt if last.prompt is not None else start.prompt,
                         last.completion if last.completion is not None else start.completion,
                         last.cached if last.cached is not None else start.cached)
        return _usage(merged, self._buffer)
