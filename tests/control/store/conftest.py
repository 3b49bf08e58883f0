"""Fixtures for the store suite: every ``store`` test runs on SQLite and on real PostgreSQL.

One PostgreSQL server per session (started only if a PostgreSQL test runs), a fresh database
per test. Missing binaries fail the tests with the apt command that fixes it, instead of
silently skipping half the suite.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from llmgw_control.store import SqlStore, connect_store
from llmgw_dev.postgres import PostgresServer, PostgresUnavailable

_db_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        pytest.fail(f"the store tests need PostgreSQL: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_database(pg_server: PostgresServer) -> Iterator[str]:
    """The name of a fresh, empty database (dropped afterwards)."""
    name = f"t{os.getpid()}_{next(_db_numbers)}"
    pg_server.create_database(name)
    yield name
    pg_server.drop_database(name)


@pytest.fixture
def pg_url(pg_server: PostgresServer, pg_database: str) -> str:
    return pg_server.url(pg_database)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store lives: a SQLite file path or a postgresql:// URL."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[SqlStore]:
    s = await connect_store(store_url)
    try:
        yield s
    finally:
        await s.aclose()
