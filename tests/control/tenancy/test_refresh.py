"""The refresh task: a store outage keeps the last known keys serving; loading waits for the store."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest
import trio
from control.tenancy.support import SECRET, FakeClock, Tenancy, bearer, make_tenancy, make_tree

from llmgw_control.api_errors import ClientApiError
from llmgw_control.store import Revisions, SqliteStore, Store, StoreUnavailable
from llmgw_control.tenancy import KeyDigester, TenancyAdmission, TenancyService, TenancyState, UsageAccumulator
from support.waiting import wait_until


class FlakyStore:
    """A real store whose reads can be made to fail, as when the database goes away."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.down = False

    async def revisions(self) -> Revisions:
        if self.down:
            raise StoreUnavailable("connection refused")
        return await self.inner.revisions()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_outage_keeps_serving_and_logs_once(
    db_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    writer = await make_tenancy(db_path, clock)
    reader_store = await SqliteStore.open(db_path, clock=clock)
    flaky = FlakyStore(reader_store)
    state = TenancyState(cast(Store, flaky), KeyDigester(SECRET), clock=clock, poll_interval=0.01)
    admission = TenancyAdmission(state, UsageAccumulator())
    try:
        tree = await make_tree(writer.service)
        key = await writer.service.create_key(name="k", group_id=tree.org)
        async with trio.open_nursery() as nursery:
            await nursery.start(state.run)
            admission.admit(bearer(key.secret), "m", estimated_tokens=1).give_back()
            with caplog.at_level(logging.WARNING, logger="llmgw_control.tenancy"):
                flaky.down = True
                await trio.sleep(0.1)  # about ten failed polls
            assert caplog.text.count("cannot refresh") == 1
            admission.admit(bearer(key.secret), "m", estimated_tokens=1).give_back()  # still served
            await writer.service.revoke_key(key.key.id)
            flaky.down = False

            def refused() -> bool:
                try:
                    admission.admit(bearer(key.secret), "m", estimated_tokens=1).give_back()
                except ClientApiError:
                    return True
                return False

            await wait_until(refused, timeout=1, interval=0.01)
            nursery.cancel_scope.cancel()
    finally:
        await reader_store.aclose()
        await writer.store.aclose()


async def test_run_returns_only_once_loaded(db_path: Path, clock: FakeClock, autojump_clock: trio.abc.Clock) -> None:
    inner = await SqliteStore.open(db_path, clock=clock)
    flaky = FlakyStore(inner)
    flaky.down = True
    state = TenancyState(cast(Store, flaky), KeyDigester(SECRET), clock=clock)
    admission = TenancyAdmission(state, UsageAccumulator())
    try:
        started = trio.Event()
        async with trio.open_nursery() as nursery:

            async def start() -> None:
                await nursery.start(state.run)
                started.set()

            nursery.start_soon(start)
            await trio.sleep(5)
            assert not state.loaded
            with pytest.raises(ClientApiError) as info:
                admission.admit(None, "m", estimated_tokens=1)
            assert info.value.status == 503  # never "open" because the store is down
            flaky.down = False
            # No deadline here: the fake clock jumps whenever the store's thread is busy.
            await started.wait()
            assert state.loaded
            admission.admit(None, "m", estimated_tokens=1).give_back()  # no keys: open, and known to be
            nursery.cancel_scope.cancel()
    finally:
        await inner.aclose()


async def test_a_committed_write_is_not_reported_as_failed_when_the_reload_fails(
    db_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    inner = await SqliteStore.open(db_path, clock=clock)
    flaky = FlakyStore(inner)
    state = TenancyState(cast(Store, flaky), KeyDigester(SECRET), clock=clock)
    service = TenancyService(cast(Store, flaky), state)
    try:
        await state.load()
        flaky.down = True
        with caplog.at_level(logging.WARNING, logger="llmgw_control.tenancy"):
            group = await service.create_group("org")
        assert "next poll" in caplog.text
        assert [g.id for g in await inner.list_groups()] == [group.id]
        flaky.down = False
        await state.refresh()
        assert group.id in state.tree
    finally:
        await inner.aclose()


class RacingStore:
    """A real store on which something happens right after one of a refresh's reads returns
    (``after[name]``, once): another daemon's writes, or a request arriving meanwhile."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.after: dict[str, Callable[[], Awaitable[None]]] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name not in self.after:
            return method

        async def read(*args: Any) -> Any:
            answer = await method(*args)
            await self.after.pop(name)()
            return answer

        return read


async def _racing_reader(
    db_path: Path, clock: FakeClock
) -> tuple[Tenancy, SqliteStore, RacingStore, TenancyState, TenancyAdmission]:
    writer = await make_tenancy(db_path, clock)
    reader_store = await SqliteStore.open(db_path, clock=clock)
    racing = RacingStore(reader_store)
    state = TenancyState(cast(Store, racing), KeyDigester(SECRET), clock=clock)
    return writer, reader_store, racing, state, TenancyAdmission(state, UsageAccumulator())


async def test_a_key_made_after_the_counters_were_read_waits_for_its_quota(db_path: Path, clock: FakeClock) -> None:
    # Issue 29: a poll that read the change counters, then the keys, could see a key committed in
    # between but not the quota set just before it: the key was unlimited until the next poll.
    writer, reader_store, racing, state, admission = await _racing_reader(db_path, clock)
    try:
        tree = await make_tree(writer.service)
        await writer.service.create_key(name="first", group_id=tree.other_team)
        await state.load()
        await writer.service.create_key(name="second", group_id=tree.other_team)  # keys changed: read them
        made: list[str] = []

        async def quota_then_key() -> None:
            await writer.service.set_quota(tree.team, {"requests_per_minute": 1})
            made.append((await writer.service.create_key(name="k", group_id=tree.project)).secret)

        racing.after["revisions"] = quota_then_key
        await state.refresh()
        admission.admit(bearer(made[0]), "m", estimated_tokens=1).settle(1, 1)
        with pytest.raises(ClientApiError) as refused:
            admission.admit(bearer(made[0]), "m", estimated_tokens=1)
        assert refused.value.status == 429
    finally:
        await reader_store.aclose()
        await writer.store.aclose()


async def test_no_request_sees_a_new_key_before_its_quotas(db_path: Path, clock: FakeClock) -> None:
    # Issue 29: keys were applied, then groups and quotas read (an await): requests admitted in
    # between had the new key and no limit (8 passed a limit of 6 in a few milliseconds).
    writer, reader_store, racing, state, admission = await _racing_reader(db_path, clock)
    try:
        tree = await make_tree(writer.service)
        await writer.service.create_key(name="first", group_id=tree.other_team)
        await state.load()
        await writer.service.set_quota(tree.team, {"requests_per_minute": 1})
        key = await writer.service.create_key(name="k", group_id=tree.project)
        admitted = 0

        async def a_request_meanwhile() -> None:
            nonlocal admitted
            for _ in range(3):
                with contextlib.suppress(ClientApiError):
                    admission.admit(bearer(key.secret), "m", estimated_tokens=1).settle(1, 1)
                    admitted += 1

        racing.after["list_quotas"] = a_request_meanwhile
        await state.refresh()
        await a_request_meanwhile()
        assert admitted == 1
    finally:
        await reader_store.aclose()
        await writer.store.aclose()
