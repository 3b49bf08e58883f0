"""Fixtures for the store suite: every ``store`` test runs on SQLite and on real PostgreSQL.

One PostgreSQL server per session (started only if a PostgreSQL test runs), a fresh database
per test. Missing binaries fail the tests with the apt command that fixes it, instead of
silently skipping half the suite.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw_control.store import SqlStore, connect_store

# pg_server, pg_database and pg_url come from tests/conftest.py.


# The PostgreSQL variant is left out of the quick tier (slow: a fresh database each); the SQLite one
# stays, and so do the tests that take pg_url themselves (test_store_backends, test_leadership).
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
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
