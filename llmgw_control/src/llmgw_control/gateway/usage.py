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
                    return TokenUsage(prompt, completion, _cached_tokens(value, prompt))


def _cached_tokens(usage: dict[str, object], prompt: int) -> int:
    """``prompt_tokens_details.cached_tokens`` when the engine reports a sane one, else 0."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int) and not isinstance(cached, bool) and 0 <= cached <= prompt:
        return cached
    return 0


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
