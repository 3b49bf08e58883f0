"""Helpers for the tenancy suite: a fake wall clock, one daemon's tenancy over SQLite, a tree."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import attrs

from llmgw_control.store import SqliteStore
from llmgw_control.tenancy import (
    KeyDigester,
    TenancyAdmission,
    TenancyService,
    TenancyState,
    UsageAccumulator,
)

# 10:30 UTC: far from midnight and from the hour's edges, unless a test moves it there.
START = datetime(2026, 12, 2, 10, 30, tzinfo=UTC).timestamp()
SECRET = b"0123456789abcdef0123456789abcdef"


class FakeClock:
    """Unix seconds that move only when a test says so."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@attrs.define
class Tenancy:
    """One daemon's tenancy parts over one store."""

    store: SqliteStore
    state: TenancyState
    admission: TenancyAdmission
    service: TenancyService
    usage: UsageAccumulator


async def make_tenancy(path: Path, clock: FakeClock, *, secret: bytes = SECRET, load: bool = True) -> Tenancy:
    store = await SqliteStore.open(path, clock=clock)
    state = TenancyState(store, KeyDigester(secret), clock=clock, poll_interval=0.02)
    usage = UsageAccumulator()
    if load:
        await state.load()
    return Tenancy(store, state, TenancyAdmission(state, usage), TenancyService(store, state, usage), usage)


@attrs.frozen
class Tree:
    org: str
    team: str
    project: str
    other_team: str


async def make_tree(service: TenancyService) -> Tree:
    org = await service.create_group("org")
    team = await service.create_group("team", org.id)
    project = await service.create_group("project", team.id)
    other = await service.create_group("other-team", org.id)
    return Tree(org.id, team.id, project.id, other.id)


def bearer(secret: str) -> str:
    return f"Bearer {secret}"
