"""Usage accounting: batching, failed and cancelled flushes, shutdown, roll-up over the tree."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest
import trio
from control.tenancy.support import FakeClock, Tenancy, bearer, make_tree

from llmgw_control.store import InvalidInput, NotFound, Store, StoreUnavailable, Usage, UsageTotals
from llmgw_control.tenancy import UsageAccumulator, UsageFlusher

T = datetime(2026, 12, 2, 10, 30, tzinfo=UTC).timestamp()
H10 = datetime(2026, 12, 2, 10, tzinfo=UTC)


class FakeUsageStore:
    """Only ``add_usage``: fails the first ``failures`` calls, optionally takes its time."""

    def __init__(self, failures: int = 0, delay: float = 0.0) -> None:
        self.batches: list[list[Usage]] = []
        self.failures = failures
        self.delay = delay
        self.calls = 0

    async def add_usage(self, deltas: Sequence[Usage]) -> None:
        self.calls += 1
        if self.delay:
            await trio.sleep(self.delay)
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("database went away")
        self.batches.append(list(deltas))

    def totals(self) -> dict[tuple[str, str, str], tuple[int, int, int]]:
        out: dict[tuple[str, str, str], tuple[int, int, int]] = {}
        for batch in self.batches:
            for u in batch:
                r, p, c = out.get((u.key_id, u.group_id, u.model), (0, 0, 0))
                out[(u.key_id, u.group_id, u.model)] = (r + u.requests, p + u.prompt_tokens, c + u.completion_tokens)
        return out


def _store(fake: FakeUsageStore) -> Store:
    return cast(Store, fake)


def test_accumulator_folds_by_hour_key_group_model() -> None:
    acc = UsageAccumulator()
    acc.record(T, "k", "g", "m", 1, 2)
    acc.record(T + 10, "k", "g", "m", 10, 20)
    acc.record(T + 3600, "k", "g", "m", 5, 5)
    acc.record(T, "k", "g", "other", 1, 1)
    assert sorted(acc.pending(), key=lambda u: (u.hour, u.model)) == [
        Usage(H10, "k", "g", "m", 2, 11, 22),
        Usage(H10, "k", "g", "other", 1, 1, 1),
        Usage(H10 + timedelta(hours=1), "k", "g", "m", 1, 5, 5),
    ]


async def test_failed_flush_keeps_everything_for_the_next_one() -> None:
    acc = UsageAccumulator()
    fake = FakeUsageStore(failures=1)
    flusher = UsageFlusher(_store(fake), acc)
    acc.record(T, "k", "g", "m", 1, 2)
    assert not await flusher.flush_once()
    assert flusher.failures == 1
    acc.record(T, "k", "g", "m", 10, 20)  # arrives while the store is down: merged, not lost
    assert await flusher.flush_once()
    assert fake.totals() == {("k", "g", "m"): (2, 11, 22)}
    assert acc.pending() == []
    assert await flusher.flush_once()  # nothing pending: no write at all
    assert fake.calls == 2


async def test_a_flush_cancelled_midway_still_completes_once() -> None:
    acc = UsageAccumulator()
    fake = FakeUsageStore(delay=0.05)
    acc.record(T, "k", "g", "m", 1, 2)
    with trio.move_on_after(0.01):
        await acc.flush(_store(fake))  # shielded: the cancel waits for the write
    assert fake.totals() == {("k", "g", "m"): (1, 1, 2)}
    assert acc.pending() == []


async def test_flusher_runs_periodically_and_once_more_at_shutdown(autojump_clock: trio.abc.Clock) -> None:
    acc = UsageAccumulator()
    fake = FakeUsageStore()
    async with trio.open_nursery() as nursery:
        await nursery.start(UsageFlusher(_store(fake), acc, interval=5).run)
        acc.record(T, "k", "g", "m", 1, 1)
        await trio.sleep(5.5)
        assert len(fake.batches) == 1
        acc.record(T, "k", "g", "m", 2, 2)  # served just before shutdown
        nursery.cancel_scope.cancel()
    assert len(fake.batches) == 2
    assert fake.totals() == {("k", "g", "m"): (2, 3, 3)}


async def test_shutdown_flush_failure_is_logged_not_raised(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    acc = UsageAccumulator()
    fake = FakeUsageStore(failures=5)
    with caplog.at_level(logging.WARNING, logger="llmgw_control.tenancy.usage"):
        async with trio.open_nursery() as nursery:
            await nursery.start(UsageFlusher(_store(fake), acc, interval=5).run)
            acc.record(T, "k", "g", "m", 1, 1)
            nursery.cancel_scope.cancel()
    assert "kept for the next try" in caplog.text
    assert len(acc.pending()) == 1


async def test_usage_by_group_including_descendants(tenancy: Tenancy, clock: FakeClock) -> None:
    service = tenancy.service
    tree = await make_tree(service)
    pkey = await service.create_key(name="p", group_id=tree.project)
    tkey = await service.create_key(name="t", group_id=tree.team)
    okey = await service.create_key(name="o", group_id=tree.other_team)
    for key, prompt, completion in ((pkey, 10, 1), (pkey, 20, 2), (tkey, 100, 10), (okey, 1000, 100)):
        tenancy.admission.admit(bearer(key.secret), "m", estimated_tokens=0).settle(prompt, completion)
    tenancy.admission.admit(bearer(pkey.secret), "other-model", estimated_tokens=0).settle(5, 5)
    tenancy.admission.admit(bearer(pkey.secret), "m", estimated_tokens=0).give_back()  # failed: not usage

    expected = {
        tree.project: UsageTotals(3, 35, 8),
        tree.team: UsageTotals(4, 135, 18),
        tree.other_team: UsageTotals(1, 1000, 100),
        tree.org: UsageTotals(5, 1135, 118),
    }
    # Before the flush (pending only), after it (store only), and half and half: the same numbers.
    assert await service.usage_rollup() == expected
    await tenancy.usage.flush(tenancy.store)
    assert await service.usage_rollup(tree.org) == expected
    tenancy.admission.admit(bearer(tkey.secret), "m", estimated_tokens=0).settle(1, 1)
    rollup = await service.usage_rollup(tree.team)
    assert set(rollup) == {tree.team, tree.project}
    assert rollup[tree.team] == UsageTotals(5, 136, 19)
    assert await service.usage_totals(group_id=tree.team) == UsageTotals(2, 101, 11)  # just the team's own keys
    assert await service.usage_totals(group_id=tree.team, include_pending=False) == UsageTotals(1, 100, 10)
    assert await service.usage_totals(group_id=tree.org, include_descendants=True, model="other-model") == (
        UsageTotals(1, 5, 5)
    )
    assert await service.usage_totals(key_id=pkey.key.id) == UsageTotals(3, 35, 8)

    # Hour filters: since rounds down to its hour, until is exclusive.
    this_hour = datetime.fromtimestamp(clock() // 3600 * 3600, UTC)
    rows = await service.query_usage(group_id=tree.project, since=this_hour + timedelta(minutes=59))
    assert sum(u.requests for u in rows) == 3
    assert await service.query_usage(until=this_hour) == []

    with pytest.raises(InvalidInput, match="until"):
        await service.query_usage(since=this_hour, until=this_hour)
    with pytest.raises(InvalidInput, match="since"):
        await service.query_usage(since=datetime(2026, 1, 1))  # naive
    with pytest.raises(NotFound):
        await service.usage_rollup("no-such-group")
