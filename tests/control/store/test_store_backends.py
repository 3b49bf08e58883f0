"""What the drivers must not do to a trio program: hang past a deadline, die on a dropped
connection, or leave a half-written transaction behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from llmgw_control.store import (
    PostgresStore,
    SqliteStore,
    SqlStore,
    StoreTimeout,
    StoreUnavailable,
    connect_store,
    open_store,
)
from llmgw_control.store.backend import Tx
from llmgw_control.store.postgres import translate
from llmgw_dev.postgres import PostgresServer, free_port
from support.waiting import wait_until


async def test_open_store_picks_the_backend(tmp_path: Path, pg_url: str) -> None:
    async with open_store(tmp_path / "a.db") as sqlite_store:
        assert isinstance(sqlite_store, SqliteStore)
    async with open_store(f"sqlite://{tmp_path / 'b.db'}") as prefixed:
        assert isinstance(prefixed, SqliteStore)
    assert (tmp_path / "b.db").exists()
    async with open_store(pg_url) as pg_store:
        assert isinstance(pg_store, PostgresStore)
    async with open_store(pg_url.replace("postgresql://", "postgres://")) as short:
        assert isinstance(short, PostgresStore)


async def test_unreachable_postgres_is_store_unavailable() -> None:
    with trio.fail_after(10), pytest.raises(StoreUnavailable, match="cannot connect"):
        await connect_store(f"postgresql://postgres@127.0.0.1:{free_port()}/x")


async def test_unopenable_sqlite_is_store_unavailable(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable):
        await connect_store(tmp_path / "missing-dir" / "store.db")


async def test_statement_timeout_bounds_a_slow_query(pg_url: str) -> None:
    async with await PostgresStore.open(pg_url, statement_timeout=0.3) as store:
        start = trio.current_time()
        with pytest.raises(StoreTimeout):
            await store.backend.run(lambda tx: tx.rows("SELECT pg_sleep(3)"), write=False)
        assert trio.current_time() - start < 2
        assert await store.list_models() == []  # the connection is usable again


async def test_cancelling_a_query_returns_at_once(store: SqlStore) -> None:
    """A cancelled caller does not wait for its thread; the store keeps working."""
    if store.dialect == "postgresql":
        slow = "SELECT pg_sleep(1.5)"
    else:
        # A recursive CTE counting to a large number keeps SQLite busy for a while.
        slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 30000000) SELECT MAX(x) FROM c"
    start = trio.current_time()
    with trio.move_on_after(0.2):
        await store.backend.run(lambda tx: tx.rows(slow), write=False)
    assert trio.current_time() - start < 0.6
    with trio.fail_after(30):
        await store.add_model("after", {})
    assert [m.name for m in await store.list_models()] == ["after"]


async def test_reconnects_after_the_server_drops_the_connection(pg_server: PostgresServer, pg_database: str) -> None:
    async with await connect_store(pg_server.url(pg_database)) as store:
        await store.add_model("before", {})
        pg_server.terminate_connections(pg_database)
        # The idle pooled connection is dead; the call retries once on a new one.
        await store.add_model("after", {})
        assert [m.name for m in await store.list_models()] == ["after", "before"]


async def test_an_error_midway_writes_nothing(store: SqlStore) -> None:
    def half(tx: Tx) -> None:
        tx.run("INSERT INTO catalog_models (name, document, created_at, updated_at) VALUES ('x', '{}', 0, 0)")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await store.backend.run(half, write=True)
    assert await store.list_models() == []


async def test_two_sqlite_stores_on_one_file(tmp_path: Path) -> None:
    """Two daemons on one SQLite file (not a supported fleet, but it must not corrupt)."""
    path = tmp_path / "shared.db"
    async with await connect_store(path) as one, await connect_store(path) as two:
        await one.add_model("m", {})
        assert [m.name for m in await two.list_models()] == ["m"]
        assert await one.lease.try_acquire("one", "a", ttl=30) is not None
        assert await two.lease.try_acquire("two", "b", ttl=30) is None


async def test_use_after_close_is_refused(store_url: str) -> None:
    store = await connect_store(store_url)
    await store.aclose()
    with pytest.raises(Exception, match="closed"):
        await store.list_models()


def test_shared_sql_must_not_contain_percent() -> None:
    with pytest.raises(ValueError, match="%"):
        translate("SELECT 5 % 2")
    assert translate("SELECT ? WHERE t < now_us()").startswith("SELECT %s WHERE t < (extract(epoch")


async def test_lease_does_not_queue_behind_slow_queries(pg_url: str) -> None:
    """The lease has its own connection: a full pool must not delay a renew into a step-down."""
    async with await PostgresStore.open(pg_url, pool_size=1) as store, trio.open_nursery() as nursery:
        holding: list[bool] = []  # set in the worker thread once the pool's one connection is ours

        def sleep_in_the_database(tx: Any) -> Any:
            holding.append(True)
            return tx.rows("SELECT pg_sleep(1.5)")

        async def slow() -> None:
            await store.backend.run(sleep_in_the_database, write=False)

        nursery.start_soon(slow)
        await wait_until(lambda: holding, timeout=30, interval=0.01)  # the pool is full from here on
        start = trio.current_time()
        assert await store.lease.try_acquire("a", "addr", ttl=5) is not None
        assert await store.lease.renew("a", ttl=5) is not None
        assert trio.current_time() - start < 0.5
