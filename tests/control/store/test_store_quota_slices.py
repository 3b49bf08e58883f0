"""Quota slices in the store, on SQLite and real PostgreSQL: grants, returns, and two connections
racing to lease under the same ancestors (the one-transaction lease over a chain)."""

from __future__ import annotations

import pytest
import trio

from llmgw_control.store import InvalidInput, Quota, SliceAsk, SqlStore, connect_store
from llmgw_control.store.slice_math import CONCURRENT, RPM, TPD


async def _tree(store: SqlStore) -> tuple[str, str, str]:
    root = (await store.create_group("root")).id
    mid = (await store.create_group("mid", root)).id
    leaf = (await store.create_group("leaf", mid)).id
    return root, mid, leaf


async def test_grant_spend_and_give_back(store: SqlStore) -> None:
    _root, mid, _leaf = await _tree(store)
    await store.set_quota(mid, Quota(requests_per_minute=100, concurrent_requests=8))
    (first,) = await store.lease_slices("a", [SliceAsk(mid, RPM)])
    assert first.lease_id is not None and first.amount == 25 and first.limit == 100 and first.holders == 1
    assert 0 < first.ttl <= 5.0
    # Another daemon: 75 free, two holders now → 75 // 8.
    (other,) = await store.lease_slices("b", [SliceAsk(mid, RPM)])
    assert other.amount == 9 and other.holders == 2
    # a spent 5 of its 25: the 20 unspent go back, the 5 keep counting for their minute.
    (again,) = await store.lease_slices("a", [SliceAsk(mid, RPM, close=first.lease_id, spent=5)])
    assert again.amount == (100 - 5 - 9) // 8
    rows = [r for r in await store.list_slices(mid) if r[1] == RPM]
    assert sorted((r[2], r[3]) for r in rows) == sorted([("a", 5), ("b", 9), ("a", again.amount)])
    # Returning without renewing; nothing spent: the row goes altogether.
    (gone,) = await store.lease_slices("a", [SliceAsk(mid, RPM, close=again.lease_id, spent=0, renew=False)])
    assert gone.lease_id is None
    assert sorted((r[2], r[3]) for r in await store.list_slices(mid) if r[1] == RPM) == [("a", 5), ("b", 9)]


async def test_waiting_requests_and_limits_that_are_not_there(store: SqlStore) -> None:
    root, _mid, leaf = await _tree(store)
    await store.set_quota(root, Quota(tokens_per_day=1000))
    grants = await store.lease_slices("a", [SliceAsk(root, TPD, need=600), SliceAsk(leaf, RPM)])
    assert grants[0].amount == 600
    assert grants[1].limit is None and grants[1].lease_id is None  # the leaf has no limit
    (short,) = await store.lease_slices("b", [SliceAsk(root, TPD, need=600)])
    assert short.amount == 400 and short.retry_after is not None and short.retry_after > 0
    (none,) = await store.lease_slices("c", [SliceAsk(root, TPD, need=1)])
    assert none.lease_id is None and none.amount == 0


async def test_concurrent_slots_in_flight_are_kept(store: SqlStore) -> None:
    _root, mid, _leaf = await _tree(store)
    await store.set_quota(mid, Quota(concurrent_requests=4))
    (a,) = await store.lease_slices("a", [SliceAsk(mid, CONCURRENT, need=3)])
    (b,) = await store.lease_slices("b", [SliceAsk(mid, CONCURRENT, need=3)])
    assert (a.amount, b.amount) == (3, 1)
    # a has 3 in flight; renewing keeps them and finds nothing more free.
    (a2,) = await store.lease_slices("a", [SliceAsk(mid, CONCURRENT, close=a.lease_id, keep=3, need=1)])
    assert a2.amount == 3
    # b returns its slot: a's next renewal can take it.
    await store.lease_slices("b", [SliceAsk(mid, CONCURRENT, close=b.lease_id, renew=False)])
    (a3,) = await store.lease_slices("a", [SliceAsk(mid, CONCURRENT, close=a2.lease_id, keep=3, need=1)])
    assert a3.amount == 4


async def test_bad_asks_are_refused(store: SqlStore) -> None:
    with pytest.raises(InvalidInput):
        await store.lease_slices("", [])
    with pytest.raises(InvalidInput):
        await store.lease_slices("a", [SliceAsk("g", "requests_per_hour")])
    assert await store.lease_slices("a", []) == []


async def test_two_connections_racing_over_one_chain_never_overgrant(store_url: str) -> None:
    """Two daemons' connections lease under the same ancestors at the same moment, many times:
    the rows never sum past any level's limit. Seen to fail on PostgreSQL without the row locks
    (both transactions read the same free amount under READ COMMITTED)."""
    first, second = await connect_store(store_url), await connect_store(store_url)
    try:
        root, mid, leaf = await _tree(first)
        limits = {root: 90, mid: 60, leaf: 1000}
        for gid, limit in limits.items():
            await first.set_quota(gid, Quota(requests_per_minute=limit))
        granted = {gid: 0 for gid in limits}

        async def lease_many(store: SqlStore, holder: str) -> None:
            for _ in range(25):
                grants = await store.lease_slices(holder, [SliceAsk(g, RPM, need=4) for g in (leaf, mid, root)])
                for grant in grants:
                    granted[grant.group_id] += grant.amount

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lease_many, first, "a")
            nursery.start_soon(lease_many, second, "b")
        for gid, limit in limits.items():
            assert granted[gid] <= limit, (gid, granted[gid], limit)
            counted = sum(r[3] for r in await first.list_slices(gid))
            assert counted == granted[gid]
        # The tight levels were leased to their end: the race was real, not two turns in a row.
        assert granted[mid] == 60 and granted[root] == 90
    finally:
        await first.aclose()
        await second.aclose()
