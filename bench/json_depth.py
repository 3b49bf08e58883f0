"""What the depth bound on network JSON costs: ``llmgw_shared.jsonin.loads`` against plain ``json.loads``.

    .venv/bin/python bench/json_depth.py

For bodies the client API sees (a short chat, a longer conversation, an embeddings batch, a chat
with a JSON-schema tool) it prints microseconds per parse for ``json.loads``, for ``jsonin.loads``
and the difference, and whether the text was scanned for its depth. The scan runs only when a body holds more
brackets than the limit; the rest of the time the bound costs two ``bytes.count`` calls.
Compare with the ~1 ms of CPU the gateway spends per request (docs/performance.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from llmgw_shared.jsonin import MAX_DEPTH, loads


def _tool(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for level in range(depth):
        schema = {"type": "object", "properties": {f"f{level}": schema}, "required": [f"f{level}"]}
    return {"type": "function", "function": {"name": "lookup", "parameters": schema}}


BODIES: dict[str, bytes] = {
    "chat, 1 message": json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi " * 30}], "max_tokens": 16}
    ).encode(),
    "chat, 40 messages": json.dumps(
        {
            "model": "tiny",
            "max_tokens": 64,
            "messages": [
                {"role": "user" if i % 2 else "assistant", "content": "some words of a conversation " * 8}
                for i in range(40)
            ],
        }
    ).encode(),
    "chat, 200 messages (scans)": json.dumps(
        {
            "model": "tiny",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "part of a long history"}]} for _ in range(200)
            ],
        }
    ).encode(),
    "embeddings, 64 inputs": json.dumps({"model": "tiny", "input": ["a sentence to embed " * 4] * 64}).encode(),
    "chat with a 6-level tool schema": json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [_tool(6)]}
    ).encode(),
}


def per_call_us(fn: Callable[[bytes], Any], body: bytes, seconds: float = 0.1) -> float:
    count, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(50):
            fn(body)
        count += 50
    return elapsed / count * 1e6


def best_of(
    fn: Callable[[bytes], Any], other: Callable[[bytes], Any], body: bytes, rounds: int = 9
) -> tuple[float, float]:
    """The fastest of several short runs of each, interleaved, so a busy machine skews both alike."""
    mine, theirs = [], []
    for _ in range(rounds):
        mine.append(per_call_us(fn, body))
        theirs.append(per_call_us(other, body))
    return min(mine), min(theirs)


def main() -> None:
    print(f"limit: {MAX_DEPTH} levels")
    print(f"{'body':34} {'bytes':>7} {'json.loads':>11} {'jsonin':>8} {'added':>7}  scan")
    for name, body in BODIES.items():
        bounded, plain = best_of(loads, json.loads, body)
        scans = body.count(b"[") + body.count(b"{") > MAX_DEPTH
        print(
            f"{name:34} {len(body):7d} {plain:9.1f}us {bounded:6.1f}us {bounded - plain:5.1f}us  "
            f"{'yes' if scans else 'no'}"
        )


if __name__ == "__main__":
    main()
