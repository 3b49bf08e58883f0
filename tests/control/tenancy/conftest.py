"""Fixtures for the tenancy suite (helpers live in ``support``, importable from the tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from control.tenancy.support import FakeClock, Tenancy, make_tenancy


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
async def tenancy(db_path: Path, clock: FakeClock) -> AsyncIterator[Tenancy]:
    t = await make_tenancy(db_path, clock)
    try:
        yield t
    finally:
        await t.store.aclose()
