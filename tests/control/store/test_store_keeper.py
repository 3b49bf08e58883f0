"""LeaseKeeper on ``store.testing.MemoryLease`` in fake time (autojump_clock): roles, takeover,
stepping down.

The memory lease keeps the lease's expiry on trio's clock, so "never leader past the lease" can be
checked exactly: a monitor samples the keepers and fails if one believes it leads while the
lease row says otherwise.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from llmgw_control.store import STANDBY, LeaseKeeper, Role
from llmgw_control.store.testing import LeaseRow, MemoryLease
from support.waiting import wait_until

TTL = 10.0
RENEW = 3.0


def _keeper(db: LeaseRow, name: str) -> tuple[LeaseKeeper, MemoryLease]:
    lease = MemoryLease(db)
    return LeaseKeeper(lease, name, f"http://{name}:8080", ttl=TTL, renew_interval=RENEW), lease


async def _never_leader_past_lease(db: LeaseRow, keepers: list[LeaseKeeper]) -> None:
    while True:
        for keeper in keepers:
            if keeper.role.leader:
                assert db.holder == keeper.holder, f"{keeper.holder} leads but the row says {db.holder}"
                assert trio.current_time() < db.expires, f"{keeper.holder} leads past its lease"
                assert keeper.role.epoch == db.epoch
        await trio.sleep(0.05)


@asynccontextmanager
async def running(
    db: LeaseRow, *keepers: LeaseKeeper, monitor: bool = True
) -> AsyncIterator[dict[str, trio.CancelScope]]:
    """Run keepers (each in its own cancel scope, to kill one) under the safety monitor."""
    scopes: dict[str, trio.CancelScope] = {}

    async def run_one(keeper: LeaseKeeper, task_status: trio.TaskStatus[Role]) -> None:
        with trio.CancelScope() as scope:
            scopes[keeper.holder] = scope
            await keeper.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        if monitor:
            nursery.start_soon(_never_leader_past_lease, db, list(keepers))
        for keeper in keepers:
            await nursery.start(run_one, keeper)
        yield scopes
        nursery.cancel_scope.cancel()


async def _wait_for(predicate: Callable[[], bool]) -> float:
    start = trio.current_time()
    # (on the autojump clock: an hour of fake time is "never")
    await wait_until(predicate, timeout=3600, interval=0.01)
    return trio.current_time() - start


async def test_one_leads_one_stands_by(autojump_clock: trio.abc.Clock) -> None:
    db = LeaseRow()
    a, lease_a = _keeper(db, "a")
    b, _ = _keeper(db, "b")
    async with running(db, a, b):
        assert a.role == Role(leader=True, epoch=1, leader_address="http://a:8080", leader_holder="a")
        assert b.role == Role(leader=False, leader_address="http://a:8080", leader_holder="a")
        await trio.sleep(300)
        assert a.role.leader and a.role.epoch == 1 and not b.role.leader
        # Renewed every interval, not more often.
        assert 300 / RENEW - 2 <= lease_a.calls <= 300 / RENEW + 3


async def test_killed_leader_is_replaced_after_the_ttl(autojump_clock: trio.abc.Clock) -> None:
    db = LeaseRow()
    a, _ = _keeper(db, "a")
    b, _ = _keeper(db, "b")
    async with running(db, a, b) as scopes:
        await trio.sleep(7)
        killed_at = trio.current_time()
        scopes["a"].cancel()  # no release: like kill -9
        await _wait_for(lambda: b.role.leader)
        took = trio.current_time() - killed_at
        assert took <= TTL + RENEW
        assert b.role.epoch == 2
        assert a.role == STANDBY


async def test_release_hands_over_within_one_poll(autojump_clock: trio.abc.Clock) -> None:
    db = LeaseRow()
    a, _ = _keeper(db, "a")
    b, _ = _keeper(db, "b")
    async with running(db, a, b):
        await trio.sleep(5)
        released_at = trio.current_time()
        assert await a.give_up() is True
        assert a.role == STANDBY
        await _wait_for(lambda: b.role.leader)
        assert trio.current_time() - released_at <= RENEW + 0.1
        await trio.sleep(60)
        assert not a.role.leader  # a released keeper does not come back


async def test_hung_database_steps_down_before_the_lease_ends(autojump_clock: trio.abc.Clock) -> None:
    db = LeaseRow()
    a, lease_a = _keeper(db, "a")
    b, _ = _keeper(db, "b")
    async with running(db, a, b):
        await trio.sleep(1)
        lease_a.hang = True
        stepped = await _wait_for(lambda: not a.role.leader)
        # It stepped down before the row expired (the monitor checks the same every 50 ms).
        assert db.holder == "a" and trio.current_time() < db.expires
        assert stepped <= TTL
        await _wait_for(lambda: b.role.leader)
        assert b.role.epoch == 2


async def test_failed_renew_steps_down_at_once(autojump_clock: trio.abc.Clock) -> None:
    db = LeaseRow()
    a, lease_a = _keeper(db, "a")
    roles: list[Role] = []
    a.on_change(roles.append)
    async with running(db, a):
        await trio.sleep(1)
        lease_a.fail = True
        stepped = await _wait_for(lambda: not a.role.leader)
        assert stepped <= RENEW  # at the first failed renew, not at the deadline
        assert roles[-1] == STANDBY
        # When the database is back, the same holder acquires again. Its lease was still live,
        # so it is the same term: epoch unchanged.
        lease_a.fail = False
        await _wait_for(lambda: a.role.leader)
        assert a.role.epoch == 1
        assert [r.leader for r in roles] == [True, False, True]


async def test_lost_lease_steps_down(autojump_clock: trio.abc.Clock) -> None:
    db = LeaseRow()
    a, _ = _keeper(db, "a")
    # No safety monitor: the row is stolen against the protocol, so a leads on stale facts
    # until its next renew, which is exactly what this test is about.
    async with running(db, a, monitor=False):
        await trio.sleep(1)
        # Someone took the row behind a's back (an operator, a clock jump on the database).
        db.holder, db.address, db.epoch, db.expires = "intruder", "http://x", db.epoch + 1, trio.current_time() + 1000
        await _wait_for(lambda: not a.role.leader)
        assert a.role.leader_address is None  # stepped down; learns the leader on its next poll
        await _wait_for(lambda: a.role.leader_holder == "intruder")
        assert a.role == Role(leader=False, leader_address="http://x", leader_holder="intruder")


async def test_standby_survives_a_hung_database(autojump_clock: trio.abc.Clock) -> None:
    db = LeaseRow()
    a, lease_a = _keeper(db, "a")
    lease_a.hang = True
    async with running(db, a):  # started() comes after the first (timed-out) attempt
        assert a.role == STANDBY
        await trio.sleep(30)
        assert a.role == STANDBY
        lease_a.hang = False
        await _wait_for(lambda: a.role.leader)


async def test_wait_change_and_wait_leader(autojump_clock: trio.abc.Clock) -> None:
    db = LeaseRow(holder="other", address="http://other", epoch=4, expires=25.0)
    a, _ = _keeper(db, "a")
    async with running(db, a):
        seen = a.role
        assert seen.leader_holder == "other"
        role = await a.wait_leader()
        assert role.epoch == 5 and trio.current_time() >= 25.0
        with trio.move_on_after(100):
            await a.wait_change(role)
            pytest.fail("role changed without reason")


def test_rejects_unsafe_timing() -> None:
    lease = MemoryLease(LeaseRow())
    with pytest.raises(ValueError, match="renew_interval"):
        LeaseKeeper(lease, "a", "addr", ttl=3, renew_interval=3)
    with pytest.raises(ValueError):
        LeaseKeeper(lease, "a", "addr", ttl=10, renew_interval=3, margin=0)
