"""The lease row itself (SqlLease) on both backends, with real time and short TTLs."""

from __future__ import annotations

import pytest
import trio

from llmgw_control.store import InvalidInput, SqlStore
from support.counted_lease import CountedLease


async def test_one_holder_at_a_time(store: SqlStore) -> None:
    lease = store.lease
    free = await lease.current()
    assert (free.holder, free.address, free.epoch) == (None, None, 0)

    grant = await lease.try_acquire("a", "http://a:8080", ttl=30)
    assert grant is not None and grant.epoch == 1
    assert await lease.try_acquire("b", "http://b:8080", ttl=30) is None
    assert await lease.renew("b", ttl=30) is None
    info = await lease.current()
    assert (info.holder, info.address, info.epoch) == ("a", "http://a:8080", 1)
    assert info.expires_at == grant.expires_at

    renewed = await lease.renew("a", ttl=30)
    assert renewed is not None and renewed.epoch == 1 and renewed.expires_at >= grant.expires_at
    # Acquiring again while holding a live lease is a renewal: same term, same epoch.
    again = await lease.try_acquire("a", "http://a:8080", ttl=30)
    assert again is not None and again.epoch == 1


async def test_takeover_after_expiry_bumps_the_epoch(store: SqlStore) -> None:
    lease = store.lease
    assert (await lease.try_acquire("a", "addr-a", ttl=0.3)) is not None
    assert await lease.try_acquire("b", "addr-b", ttl=0.3) is None
    await trio.sleep(0.4)  # the lease's expiry by the database's clock is what is tested
    assert (await lease.current()).holder is None  # lapsed: nobody leads
    taken = await lease.try_acquire("b", "addr-b", ttl=30)
    assert taken is not None and taken.epoch == 2
    # The old holder can neither renew nor take it back while b's lease is live.
    assert await lease.renew("a", ttl=30) is None
    assert await lease.try_acquire("a", "addr-a", ttl=30) is None
    assert (await lease.current()).address == "addr-b"


async def test_a_lapsed_holder_starts_a_new_term(store: SqlStore) -> None:
    lease = store.lease
    assert (await lease.try_acquire("a", "addr", ttl=0.2)) is not None
    await trio.sleep(0.3)  # the lease's expiry by the database's clock is what is tested
    # renew refuses a lapsed lease even though nobody else took it...
    assert await lease.renew("a", ttl=30) is None
    # ...and acquiring again gives a new epoch: commands from the old term are fenced off.
    grant = await lease.try_acquire("a", "addr", ttl=30)
    assert grant is not None and grant.epoch == 2


async def test_release_hands_over_at_once(store: SqlStore) -> None:
    lease = store.lease
    assert (await lease.try_acquire("a", "addr-a", ttl=30)) is not None
    assert await lease.give_up("b") is False
    assert await lease.give_up("a") is True
    info = await lease.current()
    assert (info.holder, info.address, info.epoch) == (None, None, 1)
    taken = await lease.try_acquire("b", "addr-b", ttl=30)
    assert taken is not None and taken.epoch == 2
    assert await lease.renew("a", ttl=30) is None


async def test_racing_contenders_one_wins(store: SqlStore) -> None:
    winners: list[str] = []

    async def contend(name: str) -> None:
        if await store.lease.try_acquire(name, name, ttl=30) is not None:
            winners.append(name)

    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(contend, f"h{i}")
    assert len(winners) == 1
    assert (await store.lease.current()).holder == winners[0]


async def test_bad_arguments(store: SqlStore) -> None:
    with pytest.raises(InvalidInput) as info:
        await store.lease.try_acquire("a", "addr", ttl=0)
    assert info.value.field == "ttl"
    with pytest.raises(InvalidInput) as info:
        await store.lease.try_acquire("", "addr", ttl=1)
    assert info.value.field == "holder"


# Left out of the quick tier: eight renewals of two keepers (test_store_backends keeps a real-PostgreSQL
# lease test in it).
@pytest.mark.slow
async def test_keepers_over_the_real_lease(store_url: str) -> None:
    """The LeaseKeeper over each backend's lease (SQLite is the single-daemon default)."""
    from llmgw_control.store import LeaseKeeper, connect_store

    async with await connect_store(store_url) as one, await connect_store(store_url) as two:
        counted_a, counted_b = CountedLease(one.lease), CountedLease(two.lease)
        a = LeaseKeeper(counted_a, "a", "http://a", ttl=1.0, renew_interval=0.2)
        b = LeaseKeeper(counted_b, "b", "http://b", ttl=1.0, renew_interval=0.2)
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            assert a.role.leader and a.role.epoch == 1
            assert b.role.leader_address == "http://a"
            await counted_a.more_attempts(8)  # several renewals (0.2 s apart), longer than the TTL
            await counted_b.more_attempts(1)  # and the standby polled since, finding it held
            assert a.role.leader and a.role.epoch == 1 and not b.role.leader
            assert await a.give_up()
            with trio.fail_after(2):
                role = await b.wait_leader()
            assert role.epoch == 2
            nursery.cancel_scope.cancel()
