"""Limits after a restart: a new TenancyState over the same SQLite file rebuilds its windows.

tokens/day is rebuilt exactly from the hourly usage rows; the minute windows get an estimate
(an even rate over the hour); concurrency starts from zero, since requests in flight died
with the old process. See docs/tenancy.md.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from control.tenancy.support import FakeClock, Tenancy, bearer, make_tenancy, make_tree

from llmgw_control.api_errors import ClientApiError
from llmgw_control.store import Quota
from llmgw_control.tenancy import UsageFlusher


async def _first_life(db_path: Path, clock: FakeClock, quotas: dict[str, Quota], spend: list[int]) -> tuple[str, str]:
    """Serve requests of ``spend`` tokens each under a fresh tree, flush at shutdown, stop."""
    t = await make_tenancy(db_path, clock)
    try:
        tree = await make_tree(t.service)
        for name, quota in quotas.items():
            await t.service.set_quota(getattr(tree, name), quota)
        key = await t.service.create_key(name="k", group_id=tree.project)
        async with trio.open_nursery() as nursery:
            await nursery.start(UsageFlusher(t.store, t.usage, interval=3600).run)
            for tokens in spend:
                ticket = t.admission.admit(bearer(key.secret), "m", estimated_tokens=tokens)
                ticket.settle(tokens // 2, tokens - tokens // 2)
            held = t.admission.admit(bearer(key.secret), "m", estimated_tokens=50)  # in flight when we stop
            nursery.cancel_scope.cancel()  # shutdown: the flusher writes what is pending
    finally:
        await t.store.aclose()
    held.give_back()  # the process is "gone": its reservation must not reach the next life anyway
    return key.key.id, tree.org


async def _second_life(db_path: Path, clock: FakeClock) -> tuple[Tenancy, str]:
    t = await make_tenancy(db_path, clock)
    # The old key's secret is gone by design: the test makes a new key in the same group.
    [key] = await t.store.list_keys()
    return t, key.group_id


async def _new_key(t: Tenancy, group_id: str) -> str:
    return bearer((await t.service.create_key(name="again", group_id=group_id)).secret)


async def test_tokens_per_day_hold_after_a_restart(db_path: Path, clock: FakeClock) -> None:
    await _first_life(db_path, clock, {"org": Quota(tokens_per_day=1000)}, [300, 300, 300])
    clock.advance(3 * 3600)  # hours later, same UTC day: the minute windows are long empty
    t, project = await _second_life(db_path, clock)
    try:
        auth = await _new_key(t, project)
        with pytest.raises(ClientApiError) as info:
            t.admission.admit(auth, "m", estimated_tokens=101)
        assert "tokens per day" in info.value.message and "in use 900" in info.value.message
        # Retry-After points at UTC midnight (10:30 + 3 h → 13:30: 10.5 h to go).
        assert dict(info.value.headers)["retry-after"] == str(int(10.5 * 3600))
        t.admission.admit(auth, "m", estimated_tokens=100).settle(50, 50)
        clock.advance(10.5 * 3600)  # midnight: a new day, a new budget
        t.admission.admit(auth, "m", estimated_tokens=1000).give_back()
    finally:
        await t.store.aclose()


async def test_minute_windows_get_an_estimate_that_ages_out(db_path: Path) -> None:
    # 30 s into the hour: everything this hour happened within the last minute.
    clock = FakeClock(datetime(2026, 12, 2, 10, 0, 30, tzinfo=UTC).timestamp())
    await _first_life(db_path, clock, {"team": Quota(tokens_per_minute=1000, requests_per_minute=5)}, [300] * 3)
    t, project = await _second_life(db_path, clock)
    try:
        auth = await _new_key(t, project)
        with pytest.raises(ClientApiError) as info:
            t.admission.admit(auth, "m", estimated_tokens=200)
        assert "tokens per minute" in info.value.message
        # The estimate is spread over the past minute, so room comes back bit by bit.
        t.admission.admit(auth, "m", estimated_tokens=100).give_back()
        clock.advance(10)
        t.admission.admit(auth, "m", estimated_tokens=200).give_back()
        clock.advance(60)
        t.admission.admit(auth, "m", estimated_tokens=1000).give_back()
    finally:
        await t.store.aclose()


async def test_minute_estimate_assumes_an_even_rate_over_the_hour(db_path: Path) -> None:
    # 50 minutes into the hour: 900 tokens this hour are estimated as 900 * 60 / 3000 = 18 in the
    # last minute. An estimate, not a record: a burst just before a crash is mostly forgotten.
    clock = FakeClock(datetime(2026, 12, 2, 10, 50, tzinfo=UTC).timestamp())
    await _first_life(db_path, clock, {"team": Quota(tokens_per_minute=1000)}, [300] * 3)
    t, project = await _second_life(db_path, clock)
    try:
        team = t.state.budget(t.state.tree.ancestry(project)[1])
        assert team.minute_tokens.total(clock()) == 18
        assert team.day_tokens.total(clock()) == 900
        assert team.in_flight == 0 and team.reserved == 0  # the request in flight died with the process
    finally:
        await t.store.aclose()


async def test_usage_from_before_midnight_does_not_count_today(db_path: Path) -> None:
    clock = FakeClock(datetime(2026, 12, 2, 23, 59, 40, tzinfo=UTC).timestamp())
    await _first_life(db_path, clock, {"org": Quota(tokens_per_day=1000, tokens_per_minute=1000)}, [400, 400])
    clock.advance(30)  # 00:00:10, the next day
    t, project = await _second_life(db_path, clock)
    try:
        org = t.state.budget(t.state.tree.ancestry(project)[-1])
        assert org.day_tokens.total(clock()) == 0
        # The previous hour's tail still weighs on the minute: (60 - 10) / 3600 of 800, rounded up.
        assert org.minute_tokens.total(clock()) == 12
    finally:
        await t.store.aclose()


async def test_keys_and_quotas_survive_a_restart(db_path: Path, clock: FakeClock) -> None:
    t = await make_tenancy(db_path, clock)
    try:
        tree = await make_tree(t.service)
        key = await t.service.create_key(name="k", group_id=tree.project, models=["m"])
        await t.service.set_quota(tree.team, Quota(concurrent_requests=1))
    finally:
        await t.store.aclose()
    t = await make_tenancy(db_path, clock)
    try:
        held = t.admission.admit(bearer(key.secret), "m", estimated_tokens=1)
        with pytest.raises(ClientApiError) as info:
            t.admission.admit(bearer(key.secret), "m", estimated_tokens=1)
        assert info.value.status == 429
        with pytest.raises(ClientApiError) as info:
            t.admission.admit(bearer(key.secret), "n", estimated_tokens=1)
        assert info.value.status == 403
        held.settle(1, 1)
    finally:
        await t.store.aclose()
