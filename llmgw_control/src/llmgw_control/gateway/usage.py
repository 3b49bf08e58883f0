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


def find_usage(data: bytes | bytearray) -> TokenUsage | None:
    """The last well-formed usage object in ``data``, or None."""
    position = len(data)
    while True:
        position = data.rfind(b'"usage"', 0, position)
        if position < 0:
            return None
        start = data.find(b"{", position + 7, position + 64)
        if start >= 0:
            try:
                text = bytes(data[start:start + 4096]).decode("utf-8", "replace")
                value, _ = _decoder.raw_decode(text)
            except (ValueError, RecursionError):
                # RecursionError: 4 KiB of brackets from an engine nests 2,048 deep, past the C
                # scanner's limit (llmgw_shared.jsonin explains); such a tail simply has no usage.
                value = None
            if isinstance(value, dict):
                prompt = value.get("prompt_tokens")
                completion = value.get("completion_tokens", 0)
                if isinstance(prompt, int) and isinstance(completion, int):
                    cached = _cached_tokens(value, prompt)
                    if cached is None:
                        cached = _timings_cache_n(data, prompt)
                    return TokenUsage(prompt, completion, cached or 0)


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
    """The last TAIL_BYTES of a relayed stream."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        excess = len(self._buffer) - TAIL_BYTES
        if excess > TAIL_BYTES:
            del self._buffer[:excess]

    def usage(self) -> TokenUsage | None:
        return find_usage(self._buffer)
