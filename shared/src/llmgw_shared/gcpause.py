"""Keeping Python's full garbage collections short in a daemon with much long-lived state.

A control daemon holding 1,000 node connections has on the order of a million objects that live
as long as the connections do. Python's full (generation 2) collection walks all of them, and it
ran every few seconds under heartbeat traffic, stopping the event loop each time (the figures,
from bench/fleet.py, are in docs/performance.md). Moving the survivors to the permanent generation
(``gc.freeze``, which only moves a list) every ten seconds keeps full collections to the objects
made since; every half hour everything is unfrozen and collected once, so reference cycles that
died while frozen are still reclaimed, at the price of one pause per half hour instead of one
every few seconds.
"""

from __future__ import annotations

import gc
import time

import trio

from .logs import get_logger

log = get_logger(__name__)

# Python collects its youngest generation whenever tracked allocations outrun deallocations by
# 700. A proxy's requests allocate a few thousand objects each and free nearly all of them by
# reference counting a moment later, so the count crossed 700 on every small peak: a young
# collection then walked the suspended coroutines of every request in flight and promoted them,
# feeding middle collections, and throughput fell with concurrency (docs/performance.md). At
# 20,000 the peaks no longer reach it, and the garbage that only the collector frees (reference cycles) is still
# collected, a few megabytes at most later.
YOUNG_GENERATION_THRESHOLD = 20_000


def collect_young_generation_less_often() -> None:
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, middle, old)


async def keep_gc_pauses_short(*, freeze_every: float = 10.0, full_every: float = 1800.0) -> None:
    last_full = trio.current_time()
    while True:
        await trio.sleep(freeze_every)
        if trio.current_time() - last_full >= full_every:
            started = time.perf_counter()
            gc.unfreeze()
            collected = gc.collect()
            last_full = trio.current_time()
            log.info(
                "full garbage collection: %d objects freed in %.0f ms",
                collected,
                (time.perf_counter() - started) * 1000,
            )
        gc.freeze()
