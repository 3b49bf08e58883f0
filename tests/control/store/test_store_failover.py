"""Two LeaseKeepers, each with its own PostgresStore (as two daemons would), on real PostgreSQL.

Short timings (TTL 1 s, renew every 0.25 s) keep this quick; the keeper's arithmetic does not
depend on the scale. Network trouble is simulated with a small TCP proxy in front of the
server that can freeze (hold bytes without closing: a hung connection) or cut connections.

"Nothing changed" checks wait for a count of the keepers' own lease attempts (``_attempts``, see
tests/support/counted_lease.py), not for a fixed time.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from llmgw_control.store import STANDBY, LeaseKeeper, PostgresStore, Role
from llmgw_dev.postgres import PostgresServer
from support.counted_lease import CountedLease
from support.waiting import wait_until

# Left out of the quick tier (slow: real PostgreSQL failover over TTL-long waits);
# test_store_lease and test_store_backends keep real-PostgreSQL tests in it.
pytestmark = pytest.mark.slow


TTL = 1.0
RENEW = 0.25
MARGIN = 0.2
SLACK = 0.5  # scheduling noise on a busy 2-core machine


class Proxy:
    """A TCP relay to PostgreSQL that can freeze (hold traffic, keep sockets open) or cut."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._thawed = trio.Event()
        self._thawed.set()
        self._cut = trio.CancelScope()

    def freeze(self) -> None:
        self._thawed = trio.Event()

    def thaw(self) -> None:
        self._thawed.set()

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        with self._cut:
            await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, client: trio.SocketStream) -> None:
        async with client, await trio.open_tcp_stream("127.0.0.1", self.target_port) as upstream:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
                nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope) -> None:
        try:
            while data := await src.receive_some(65536):
                await self._thawed.wait()
                await dst.send_all(data)
        except trio.BrokenResourceError:
            pass
        scope.cancel()


_COUNTED: weakref.WeakKeyDictionary[LeaseKeeper, CountedLease] = weakref.WeakKeyDictionary()


def _keeper(store: PostgresStore, name: str) -> LeaseKeeper:
    counted = CountedLease(store.lease)
    keeper = LeaseKeeper(counted, name, f"http://{name}:8080", ttl=TTL, renew_interval=RENEW, margin=MARGIN)
    _COUNTED[keeper] = counted
    return keeper


async def _attempts(keeper: LeaseKeeper, count: int) -> None:
    """Return once ``keeper`` has made ``count`` more lease attempts (renews as leader, polls as standby)."""
    await _COUNTED[keeper].more_attempts(count)


# Attempts, each at least a poll/renew interval (RENEW here) after the last, that span one TTL:
# long enough for a lease nobody renews to lapse and be taken.
ATTEMPTS_PER_TTL = round(TTL / RENEW) + 1


async def _wait_for(predicate: Callable[[], bool], within: float) -> float:
    start = trio.current_time()
    await wait_until(predicate, timeout=within, interval=0.01)
    return trio.current_time() - start


@asynccontextmanager
async def _daemons(
    *urls: str, statement_timeout: float = 5.0
) -> AsyncIterator[tuple[list[LeaseKeeper], list[trio.CancelScope]]]:
    """One store and keeper per URL, each keeper killable through its cancel scope."""
    stores = [await PostgresStore.open(url, statement_timeout=statement_timeout) for url in urls]
    keepers = [_keeper(store, f"d{i}") for i, store in enumerate(stores)]
    scopes: list[trio.CancelScope] = []

    async def run(keeper: LeaseKeeper, task_status: trio.TaskStatus[Role]) -> None:
        with trio.CancelScope() as scope:
            scopes.append(scope)
            await keeper.run(task_status=task_status)

    try:
        async with trio.open_nursery() as nursery:
            for keeper in keepers:
                await nursery.start(run, keeper)
            yield keepers, scopes
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for store in stores:
                await store.aclose()


async def test_one_leads_the_other_stands_by(pg_url: str) -> None:
    async with _daemons(pg_url, pg_url) as ([a, b], _):
        assert a.role == Role(leader=True, epoch=1, leader_address="http://d0:8080", leader_holder="d0")
        assert b.role == Role(leader=False, leader_address="http://d0:8080", leader_holder="d0")
        await _attempts(a, 3 * ATTEMPTS_PER_TTL)  # renewing keeps the lead well past one TTL
        await _attempts(b, 1)  # and the standby, polling since, found it held
        assert a.role.leader and a.role.epoch == 1 and b.role.leader_holder == "d0"


async def test_killed_leader_is_replaced_after_the_ttl(pg_url: str) -> None:
    async with _daemons(pg_url, pg_url) as ([a, b], scopes):
        scopes[0].cancel()  # no release: like kill -9
        took = await _wait_for(lambda: b.role.leader, within=TTL + RENEW + SLACK + 1)
        assert TTL - RENEW - SLACK < took <= TTL + RENEW + SLACK
        assert b.role.epoch == 2 and a.role == STANDBY


async def test_released_lease_is_taken_within_one_poll(pg_url: str) -> None:
    async with _daemons(pg_url, pg_url) as ([a, b], _):
        assert await a.give_up()
        took = await _wait_for(lambda: b.role.leader, within=RENEW + SLACK + 1)
        assert took <= RENEW + SLACK
        assert b.role.epoch == 2
        # a stopped trying (released): b's renews over two TTLs are the passes a could have used.
        await _attempts(b, 2 * ATTEMPTS_PER_TTL)
        assert not a.role.leader


async def test_hung_connection_steps_down_before_the_lease_lapses(pg_server: PostgresServer, pg_url: str) -> None:
    async with trio.open_nursery() as nursery:
        proxy = Proxy(pg_server.port)
        port = await nursery.start(proxy.serve)
        via_proxy = pg_url.replace(f":{pg_server.port}/", f":{port}/")
        async with _daemons(via_proxy, pg_url) as ([a, b], _):
            assert a.role.leader
            proxy.freeze()
            frozen_at = trio.current_time()
            stepped = await _wait_for(lambda: not a.role.leader, within=TTL + SLACK)
            # Bounded by its local deadline (last grant + TTL - margin), not by the database.
            assert stepped <= TTL - MARGIN + 0.1
            took = await _wait_for(lambda: b.role.leader, within=TTL + RENEW + SLACK + 1)
            assert trio.current_time() - frozen_at >= stepped
            assert b.role.epoch == 2 and took > 0
            proxy.thaw()
        nursery.cancel_scope.cancel()


async def test_leader_that_cannot_reconnect_steps_down(pg_server: PostgresServer, pg_database: str) -> None:
    url = pg_server.url(pg_database)
    async with _daemons(url, url) as ([a, b], _):
        assert a.role.leader
        pg_server.execute(f"ALTER DATABASE {pg_database} ALLOW_CONNECTIONS false")
        pg_server.terminate_connections(pg_database)
        stepped = await _wait_for(lambda: not a.role.leader, within=TTL)
        assert stepped <= RENEW + SLACK  # the first failed renew, not the deadline
        await _attempts(a, ATTEMPTS_PER_TTL)  # past the lease's lapse, both have tried and failed
        await _attempts(b, ATTEMPTS_PER_TTL)
        assert not a.role.leader and not b.role.leader
        pg_server.execute(f"ALTER DATABASE {pg_database} ALLOW_CONNECTIONS true")
        await _wait_for(lambda: a.role.leader or b.role.leader, within=TTL + RENEW + SLACK + 1)


async def test_dropped_connection_that_reconnects_keeps_the_lead(pg_server: PostgresServer, pg_database: str) -> None:
    """pg_terminate_backend alone: the next renew retries once on a fresh connection (nothing
    was committed on the dead one), so leadership survives a server-side disconnect."""
    url = pg_server.url(pg_database)
    async with _daemons(url, url) as ([a, _b], _):
        changes: list[Role] = []
        a.on_change(changes.append)
        for _ in range(3):
            pg_server.terminate_connections(pg_database)
            await _attempts(a, 2)  # the retried renew, and one more on the fresh connection
        assert a.role.leader and a.role.epoch == 1 and changes == []


@pytest.mark.slow
async def test_server_outage_steps_the_leader_down(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = await trio.to_thread.run_sync(PostgresServer.start)
    try:
        await trio.to_thread.run_sync(server.create_database, "outage")
        url = server.url("outage")
        async with _daemons(url, url, statement_timeout=1.0) as ([a, b], _):
            assert a.role.leader
            await trio.to_thread.run_sync(server.pause)
            stepped = await _wait_for(lambda: not a.role.leader, within=TTL + SLACK)
            assert stepped <= TTL
            await _attempts(a, ATTEMPTS_PER_TTL)
            await _attempts(b, ATTEMPTS_PER_TTL)
            assert not a.role.leader and not b.role.leader
            await trio.to_thread.run_sync(server.resume)
            await _wait_for(lambda: a.role.leader or b.role.leader, within=TTL + RENEW + 10)
            leader = a if a.role.leader else b
            assert leader.role.epoch == 2  # a new term after the outage
    finally:
        await trio.to_thread.run_sync(server.stop)
