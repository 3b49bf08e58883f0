"""One concurrency level of a capacity run: streamed requests straight to one replica, measured.

At concurrency ``c``, ``c`` workers each send one streamed ``/v1/completions`` request after the
other (a closed loop: the level holds ``c`` requests in flight) until ``level_seconds`` have
passed; requests still running then are waited for, a bounded time. Every request asks for the
same prompt (a word repeated ``prompt_tokens`` times, about one token each) and exactly
``output_tokens`` tokens (``ignore_eos``, so a model that would stop early does not shorten the
level's work). The request goes to the replica's own URL with its bearer key, as the gateway sends
it, so the numbers are the engine's and not the gateway's queue.

Measured per request: time to first token (request sent -> first content event), the gaps
between content events (inter-token latency), and the engine's own ``usage`` counts. Per level:
prompt and generation tokens per second over the level's wall time, and the p50/p99 of both
latencies (nearest rank, ``capacity.percentile``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import attrs
import httpx2
import trio

from .capacity import LevelResult, percentile

# Seconds a request still in flight when its level's time is up may take to finish; one that
# takes longer is cut and counted as an error. Two minutes covers a long output on a slow CPU.
DRAIN_GRACE = 120.0
# Seconds to connect to a replica: it is ready and close (a node of this fleet).
CONNECT_TIMEOUT = 10.0
# The reason of a level's first failed request, kept that long (an engine's error body).
MAX_ERROR_TEXT = 300


@attrs.frozen
class SweepTarget:
    """Where a level's requests go: a replica's URL, its bearer key, the model name it serves."""

    url: str
    api_key: str = attrs.field(repr=False)
    model: str


@attrs.frozen
class Workload:
    prompt_tokens: int
    output_tokens: int
    level_seconds: float


@attrs.define
class _Tally:
    ttft: list[float] = attrs.Factory(list)
    itl: list[float] = attrs.Factory(list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    errors: int = 0
    first_error: str = ""

    def failed(self, reason: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or reason[:MAX_ERROR_TEXT]


def prompt_of(tokens: int) -> str:
    return " ".join(["hello"] * tokens)


def request_body(target: SweepTarget, workload: Workload) -> dict[str, object]:
    return {
        "model": target.model,
        "prompt": prompt_of(workload.prompt_tokens),
        "max_tokens": workload.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0,
    }


async def _one_request(
    client: httpx2.AsyncClient,
    target: SweepTarget,
    body: dict[str, object],
    tally: _Tally,
    clock: Callable[[], float],
    on_done: Callable[[], None],
) -> None:
    headers = {"authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    sent = clock()
    events: list[float] = []
    usage: dict[str, object] = {}
    try:
        async with client.stream(
            "POST", target.url.rstrip("/") + "/v1/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                text = (await response.aread())[:MAX_ERROR_TEXT].decode("utf-8", "replace")
                tally.failed(f"HTTP {response.status_code}: {text}")
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if not isinstance(event, dict):
                    continue
                choices = event.get("choices") or []
                if choices and isinstance(choices[0], dict) and choices[0].get("text"):
                    events.append(clock())
                if isinstance(event.get("usage"), dict):
                    usage = event["usage"]
    except (httpx2.HTTPError, ValueError, UnicodeDecodeError) as exc:
        tally.failed(f"{type(exc).__name__}: {exc}")
        return
    finally:
        on_done()
    if not events:
        tally.failed("the stream had no tokens")
        return
    tally.requests += 1
    tally.ttft.append(events[0] - sent)
    tally.itl.extend(b - a for a, b in itertools.pairwise(events))
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    tally.prompt_tokens += prompt if isinstance(prompt, int) else 0
    tally.completion_tokens += completion if isinstance(completion, int) else len(events)


async def measure_level(
    client: httpx2.AsyncClient,
    target: SweepTarget,
    workload: Workload,
    concurrency: int,
    *,
    clock: Callable[[], float] = trio.current_time,
    on_done: Callable[[], None] = lambda: None,
) -> tuple[LevelResult, str]:
    """Run one level; its result and the first failure's reason ("" when none failed).

    ``on_done`` is called as each request ends (the run keeps its replica marked as used)."""
    body = request_body(target, workload)
    tally = _Tally()
    started = clock()
    deadline = started + workload.level_seconds

    async def worker() -> None:
        while True:
            await _one_request(client, target, body, tally, clock, on_done)
            if clock() >= deadline:
                return

    with trio.move_on_after(workload.level_seconds + DRAIN_GRACE) as scope:
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
    if scope.cancelled_caught:
        tally.failed(f"requests still running {DRAIN_GRACE:.0f} s after the level's time were cut")
    duration = max(clock() - started, 1e-9)
    result = LevelResult(
        concurrency=concurrency,
        requests=tally.requests,
        errors=tally.errors,
        duration_s=round(duration, 3),
        prompt_tokens_per_s=round(tally.prompt_tokens / duration, 2),
        generation_tokens_per_s=round(tally.completion_tokens / duration, 2),
        # Microseconds: events that arrive in one read are a few µs apart, and a fast engine's gaps
        # rounded to 0.1 ms read as 0 (a tiny model under load did, and looked like no measurement).
        ttft_p50_s=round(percentile(tally.ttft, 0.5), 6),
        ttft_p99_s=round(percentile(tally.ttft, 0.99), 6),
        itl_p50_s=round(percentile(tally.itl, 0.5), 6),
        itl_p99_s=round(percentile(tally.itl, 0.99), 6),
    )
    return result, tally.first_error


def new_client(max_concurrency: int) -> httpx2.AsyncClient:
    """One client per run: a connection per concurrent request, bounded waits."""
    limits = httpx2.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    timeout = httpx2.Timeout(DRAIN_GRACE, connect=CONNECT_TIMEOUT)
    return httpx2.AsyncClient(limits=limits, timeout=timeout)
