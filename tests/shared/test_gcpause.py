"""The GC freezer moves survivors out of full collections, and unfreezes for the periodic full one."""

from __future__ import annotations

import gc

import trio
import trio.testing

from llmgw_shared.gcpause import YOUNG_GENERATION_THRESHOLD, collect_young_generation_less_often, keep_gc_pauses_short


async def test_survivors_are_frozen_and_the_full_collection_unfreezes_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gc.unfreeze()
    keep = [object() for _ in range(1000)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: keep_gc_pauses_short(freeze_every=10, full_every=35))
        await trio.sleep(11)
        assert gc.get_freeze_count() >= len(keep)
        frozen_before_full = gc.get_freeze_count()
        await trio.sleep(30)  # past full_every: unfreeze, collect, freeze again
        assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() <= frozen_before_full + 100_000
        nursery.cancel_scope.cancel()
    gc.unfreeze()
    del keep


def test_young_collections_wait_for_more_than_a_requests_worth_of_objects() -> None:
    before = gc.get_threshold()
    try:
        collect_young_generation_less_often()
        assert gc.get_threshold() == (YOUNG_GENERATION_THRESHOLD, *before[1:])
        # Objects freed by reference counting, as a request's are, never trigger a collection.
        gc.collect(0)  # counting from zero
        collections = gc.get_stats()[0]["collections"]
        for _ in range(200):
            garbage = [[i] for i in range(5_000)]
            del garbage
        assert gc.get_stats()[0]["collections"] == collections
    finally:
        gc.set_threshold(*before)
