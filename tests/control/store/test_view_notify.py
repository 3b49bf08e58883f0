"""On PostgreSQL a standby hears the leader's view through LISTEN/NOTIFY, not the poll.

Every follower here has both its polls (the safety poll, and the one while not listening) set to
an hour: a change that arrives did so by notification or by the full read after a reconnect.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from llmgw_control.fleet.view import ViewFollower
from llmgw_control.gateway.replicas import ReplicaSet
from llmgw_control.store import VIEW_CHANNEL, PostgresStore, PublishedReplica, SqlStore, ViewListener, connect_store
from llmgw_control.store.backend import Tx
from llmgw_control.store.postgres import LISTEN_APPLICATION_NAME, PostgresBackend
from llmgw_control.store.view_notify import parse_revision
from support.waiting import wait_until

HOUR = 3600.0
# Generous: a loaded 2-core machine; a pass takes a fraction of a second.
LIMIT = 30.0
A = PublishedReplica(id="s-a", profile_key="llama:small", url="http://10.0.0.1:8001", slots=2)
B = PublishedReplica(id="s-b", profile_key="qwen:gpu", url="http://10.0.0.2:8002", slots=1)


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[SqlStore]:
    s = await connect_store(pg_url)
    try:
        yield s
    finally:
        await s.aclose()


async def _until(condition: Callable[[], bool]) -> None:
    await wait_until(condition, timeout=LIMIT, interval=0.01)


def _follower(store: SqlStore, listener: ViewListener | None = None) -> tuple[ViewFollower, ReplicaSet]:
    standby = ReplicaSet()
    follower = ViewFollower(store, standby, lambda rid: f"key-of-{rid}", listener=listener, safety_poll=HOUR, poll=HOUR)
    return follower, standby


async def _listening(follower: ViewFollower) -> None:
    """Until LISTEN is in place and the read it asked for is done: what follows is heard, not read."""
    assert follower.listener is not None
    await _until(lambda: follower.listener.connects >= 1 and follower.reads >= 2)  # type: ignore[union-attr]


async def _notify(store: SqlStore, payload: str) -> None:
    def send(tx: Tx) -> None:
        tx.one("SELECT pg_notify(?, ?)", (VIEW_CHANNEL, payload))

    await store.backend.run(send, write=True)


async def _cut_listen_connections(store: SqlStore) -> int:
    def cut(tx: Tx) -> int:
        rows = tx.rows(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = ? AND datname = current_database()",
            (LISTEN_APPLICATION_NAME,),
        )
        return len(rows)

    return await store.backend.run(cut, write=True)


async def test_a_published_change_arrives_by_notification(pg_store: SqlStore) -> None:
    assert isinstance(pg_store, PostgresStore)
    follower, standby = _follower(pg_store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower.run)
        await _listening(follower)
        assert standby.get("s-a") is None
        await pg_store.publish_view(1, [A])
        await _until(lambda: standby.get("s-a") is not None)
        await pg_store.publish_view(1, [B])  # s-a withdrawn by the leader
        await _until(lambda: standby.get("s-a") is None and standby.get("s-b") is not None)
        nursery.cancel_scope.cancel()


async def test_a_cut_listen_connection_comes_back_and_reads_what_it_missed(pg_store: SqlStore) -> None:
    backend = pg_store.backend
    assert isinstance(backend, PostgresBackend)
    gate = threading.Event()  # holds every reconnect back until the test has published
    gate.set()

    def connect() -> psycopg.Connection[Any]:
        if not gate.wait(LIMIT):
            raise psycopg.OperationalError("the test never opened the gate")
        return backend.listen_connection()

    listener = ViewListener(connect)
    follower, standby = _follower(pg_store, listener)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower.run)
        await _listening(follower)
        gate.clear()
        assert await _cut_listen_connections(pg_store) == 1
        await _until(lambda: listener.losses == 1)
        await pg_store.publish_view(1, [A])  # nobody listens: only the full read can find it
        reads = follower.reads
        assert standby.get("s-a") is None
        gate.set()
        await _until(lambda: standby.get("s-a") is not None)
        assert listener.connects == 2 and follower.reads > reads
        await pg_store.publish_view(1, [B])  # and the new connection hears the next one
        await _until(lambda: standby.get("s-b") is not None)
        nursery.cancel_scope.cancel()
        gate.set()


async def test_a_garbage_payload_on_the_channel_is_ignored(pg_store: SqlStore) -> None:
    follower, standby = _follower(pg_store)
    listener = follower.listener
    assert listener is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower.run)
        await _listening(follower)
        reads = follower.reads
        for payload in ("garbage", "", "-1", "1e9", "٣", "9" * 40, "x" * 7000, '{"id": "s-a"}'):
            await _notify(pg_store, payload)
        await _until(lambda: listener.ignored == 8)
        assert follower.reads == reads and listener.connects == 1  # no read, no reconnect
        await pg_store.publish_view(1, [A])
        await _until(lambda: standby.get("s-a") is not None)
        assert listener.connects == 1
        nursery.cancel_scope.cancel()


async def test_cancelling_a_follower_returns_at_once_and_closes_its_connection(pg_store: SqlStore) -> None:
    follower, _ = _follower(pg_store)
    with trio.move_on_after(LIMIT) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follower.run)
            await _listening(follower)
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught

    def listening(tx: Tx) -> int:
        row = tx.one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ? AND datname = current_database()",
            (LISTEN_APPLICATION_NAME,),
        )
        return int(row[0]) if row else 0

    await _until_async(lambda: pg_store.backend.run(listening, write=False), 0)


async def _until_async(probe: Callable[[], Any], expected: object) -> None:
    async def reached() -> bool:
        return bool(await probe() == expected)

    await wait_until(reached, timeout=LIMIT)


@given(st.one_of(st.text(max_size=64), st.binary(max_size=16), st.integers(), st.none()))
def test_a_payload_is_a_revision_or_nothing(payload: object) -> None:
    revision = parse_revision(payload)
    if revision is not None:
        assert isinstance(payload, str) and payload.isascii() and payload.isdigit()
        assert revision == int(payload) and 0 <= revision < 10**19


async def test_publishing_notifies_the_revision_and_only_it(pg_store: SqlStore, pg_url: str) -> None:
    conn = await trio.to_thread.run_sync(lambda: psycopg.connect(pg_url, autocommit=True))
    try:
        await trio.to_thread.run_sync(conn.execute, f"LISTEN {VIEW_CHANNEL}")
        revision = await pg_store.publish_view(1, [A, B])
        heard = await trio.to_thread.run_sync(lambda: [n.payload for n in conn.notifies(timeout=LIMIT, stop_after=1)])
        assert heard == [str(revision)]  # no replica, no key: the revision alone
        await pg_store.lease.try_acquire("two", "ws://x", 30)
        await pg_store.lease.give_up("two")
        await pg_store.lease.try_acquire("three", "ws://x", 30)
        assert await pg_store.publish_view(1, [A]) is None  # refused: nothing to hear
        await _notify(pg_store, "marker")
        heard = await trio.to_thread.run_sync(lambda: [n.payload for n in conn.notifies(timeout=LIMIT, stop_after=1)])
        assert heard == ["marker"]
    finally:
        await trio.to_thread.run_sync(conn.close)


async def test_while_the_listen_connection_is_down_the_follower_polls(pg_store: SqlStore) -> None:
    backend = pg_store.backend
    assert isinstance(backend, PostgresBackend)
    gate = threading.Event()
    gate.set()

    def connect() -> psycopg.Connection[Any]:
        if not gate.wait(LIMIT):
            raise psycopg.OperationalError("the test never opened the gate")
        return backend.listen_connection()

    listener = ViewListener(connect)
    standby = ReplicaSet()
    follower = ViewFollower(pg_store, standby, lambda rid: "k", listener=listener, safety_poll=HOUR, poll=0.05)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower.run)
        await _listening(follower)
        gate.clear()
        assert await _cut_listen_connections(pg_store) == 1
        await _until(lambda: listener.losses == 1)
        await pg_store.publish_view(1, [A])
        await _until(lambda: standby.get("s-a") is not None)  # by the poll: nobody listens
        assert listener.connects == 1
        nursery.cancel_scope.cancel()
        gate.set()
