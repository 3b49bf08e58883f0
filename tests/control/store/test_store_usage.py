"""Usage: batched add-by-upsert, hour buckets, filters, roll-up over the group tree."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import trio

from llmgw_control.store import InvalidInput, SqlStore, Usage, UsageTotals

H0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
H1 = H0 + timedelta(hours=1)


async def _tree(store: SqlStore) -> tuple[str, str, str, str]:
    org = (await store.create_group("org")).id
    team = (await store.create_group("team", org)).id
    project = (await store.create_group("project", team)).id
    other = (await store.create_group("other")).id
    return org, team, project, other


async def test_add_accumulates_within_the_hour(store: SqlStore) -> None:
    await store.add_usage(
        [
            Usage(H0 + timedelta(minutes=5), "k1", "g1", "m", requests=1, prompt_tokens=10, completion_tokens=20),
            Usage(H0 + timedelta(minutes=59, seconds=59), "k1", "g1", "m", 2, 1, 1),
            Usage(H1, "k1", "g1", "m", 1, 0, 0),
        ]
    )
    await store.add_usage([Usage(H0, "k1", "g1", "m", 1, 100, 100)])
    rows = await store.query_usage()
    assert rows == [
        Usage(H0, "k1", "g1", "m", requests=4, prompt_tokens=111, completion_tokens=121),
        Usage(H1, "k1", "g1", "m", requests=1, prompt_tokens=0, completion_tokens=0),
    ]
    await store.add_usage([])  # an empty batch is a no-op, not an error


async def test_filters_and_rollup(store: SqlStore) -> None:
    org, team, project, other = await _tree(store)
    await store.add_usage(
        [
            Usage(H0, "k-org", org, "m1", 1, 1, 1),
            Usage(H0, "k-team", team, "m1", 10, 10, 10),
            Usage(H1, "k-proj", project, "m2", 100, 100, 100),
            Usage(H1, "k-other", other, "m1", 1000, 1000, 1000),
            Usage(H0, "", "", "m1", 7, 7, 7),  # an open gateway: no key, no group
        ]
    )
    assert await store.usage_totals(group_id=org) == UsageTotals(1, 1, 1)
    assert await store.usage_totals(group_id=org, include_descendants=True) == UsageTotals(111, 111, 111)
    assert await store.usage_totals(group_id=team, include_descendants=True) == UsageTotals(110, 110, 110)
    assert await store.usage_totals(model="m1") == UsageTotals(1018, 1018, 1018)
    assert await store.usage_totals(key_id="k-proj") == UsageTotals(100, 100, 100)
    assert await store.usage_totals(key_id="") == UsageTotals(7, 7, 7)
    assert await store.usage_totals(since=H1) == UsageTotals(1100, 1100, 1100)
    assert await store.usage_totals(until=H1) == UsageTotals(18, 18, 18)
    # since rounds down to its hour; until is exclusive.
    assert await store.usage_totals(since=H0 + timedelta(minutes=30), until=H1 + timedelta(minutes=1)) == (
        UsageTotals(1118, 1118, 1118)
    )
    rows = await store.query_usage(group_id=org, include_descendants=True, model="m1")
    assert sorted((r.group_id, r.requests) for r in rows) == sorted([(org, 1), (team, 10)])
    assert await store.usage_totals(group_id="unknown", include_descendants=True) == UsageTotals(0, 0, 0)


async def test_bad_batch_writes_nothing(store: SqlStore) -> None:
    good = Usage(H0, "k", "g", "m", 1, 1, 1)
    for bad, field in [
        (Usage(H0, "k", "g", "m", requests=-1), "deltas[1].requests"),
        (Usage(H0, "k", "g", "", 1), "deltas[1].model"),
        (Usage(datetime(2026, 1, 1), "k", "g", "m", 1), "deltas[1].hour"),
        (Usage(H0, "k", "g", "m", prompt_tokens=True), "deltas[1].prompt_tokens"),
    ]:
        with pytest.raises(InvalidInput) as info:
            await store.add_usage([good, bad])
        assert info.value.field == field
    assert await store.query_usage() == []
    with pytest.raises(InvalidInput):
        await store.query_usage(since=datetime(2026, 1, 1))


async def test_concurrent_batches_add_up(store: SqlStore) -> None:
    """Several flushers upserting the same rows at once: nothing lost, nothing doubled."""

    async def flusher(n: int) -> None:
        for _ in range(5):
            await store.add_usage([Usage(H0, "k", "g", m, 1, 2, 3) for m in ("a", "b", "c")])

    async with trio.open_nursery() as nursery:
        for n in range(4):
            nursery.start_soon(flusher, n)
    assert await store.usage_totals() == UsageTotals(60, 120, 180)
    assert await store.usage_totals(model="b") == UsageTotals(20, 40, 60)
