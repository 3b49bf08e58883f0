"""The one implementation of ``Store``, over a backend; and how to open one.

``SqliteStore`` and ``PostgresStore`` differ only in how they connect: the queries are shared,
which is what makes "both behave identically" true by construction and checkable by running
one test suite against both.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

from . import migrations
from .backend import Backend, Tx
from .interface import Store
from .lease import SqlLease
from .migrations import MIGRATIONS, REVISION_KINDS, Migration
from .ops_audit import AuditOps
from .ops_capacity import CapacityOps
from .ops_catalog import CatalogOps
from .ops_fleet import FleetOps
from .ops_groups import GroupOps
from .ops_keys import KeyOps
from .ops_nodes import NodeOps
from .ops_pulls import PullOps
from .ops_quota_slices import QuotaSliceOps
from .ops_quotas import QuotaOps
from .ops_secrets import SecretOps
from .ops_sessions import SessionOps
from .ops_usage import UsageOps
from .ops_view import ViewOps
from .postgres import PostgresBackend
from .records import Revisions
from .sqlite import SqliteBackend
from .transactions import TransactionCounts
from .view_notify import ViewListener


class SqlStore(
    CatalogOps,
    NodeOps,
    GroupOps,
    KeyOps,
    QuotaOps,
    QuotaSliceOps,
    UsageOps,
    CapacityOps,
    SecretOps,
    FleetOps,
    PullOps,
    ViewOps,
    AuditOps,
    SessionOps,
):
    def __init__(self, backend: Backend, lease_backend: Backend | None = None) -> None:
        self._backend = backend
        self._lease_backend = lease_backend
        # One count for the store and its lease: both are this process's coordination cost.
        self.transactions = TransactionCounts()
        self._lease = SqlLease(lease_backend or backend, self.transactions)

    @property
    def lease(self) -> SqlLease:
        return self._lease

    @property
    def dialect(self) -> str:
        return self._backend.dialect

    @property
    def backend(self) -> Backend:
        """The raw backend, for maintenance tools and tests; daemons use the methods."""
        return self._backend

    async def aclose(self) -> None:
        await self._backend.aclose()
        if self._lease_backend is not None:
            await self._lease_backend.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def view_listener(self) -> ViewListener | None:
        """What tells a standby the view changed, or None: SQLite has no notifications (poll)."""
        return None

    async def schema_version(self) -> int:
        return await migrations.schema_version(self._backend)

    async def revisions(self) -> Revisions:
        def read(tx: Tx) -> Revisions:
            values = {r[0]: int(r[1]) for r in tx.rows("SELECT kind, value FROM revisions")}
            return Revisions(**{kind: values.get(kind, 0) for kind in REVISION_KINDS})

        return await self._read(read)

    @classmethod
    async def _opened(
        cls, backend: Backend, migration_steps: tuple[Migration, ...], lease_backend: Backend | None = None
    ) -> Self:
        try:
            await migrations.migrate(backend, migration_steps)
        except BaseException:
            await backend.aclose()
            if lease_backend is not None:
                await lease_backend.aclose()
            raise
        return cls(backend, lease_backend)


class SqliteStore(SqlStore):
    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        busy_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
        migration_steps: tuple[Migration, ...] = MIGRATIONS,
    ) -> SqliteStore:
        """Open (creating if needed) a SQLite file and migrate it. ``clock`` is for tests."""
        backend = await SqliteBackend.connect(path, busy_timeout=busy_timeout, clock=clock)
        return await cls._opened(backend, migration_steps)


class PostgresStore(SqlStore):
    @classmethod
    async def open(
        cls,
        url: str,
        *,
        pool_size: int = 4,
        statement_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        migration_steps: tuple[Migration, ...] = MIGRATIONS,
    ) -> PostgresStore:
        """Connect to PostgreSQL (``postgresql://…``) and migrate the database."""
        backend = PostgresBackend(
            url, pool_size=pool_size, statement_timeout=statement_timeout, connect_timeout=connect_timeout
        )
        # The lease gets a connection of its own: a renew must never queue behind slow admin
        # queries for a pool slot, or a busy leader would step down for no good reason.
        lease_backend = PostgresBackend(
            url, pool_size=1, statement_timeout=min(statement_timeout, 5.0), connect_timeout=connect_timeout
        )
        return await cls._opened(backend, migration_steps, lease_backend)

    def view_listener(self) -> ViewListener:
        backend = self._backend
        assert isinstance(backend, PostgresBackend)
        return ViewListener(backend.listen_connection)


def is_postgres_url(url_or_path: str | Path) -> bool:
    return isinstance(url_or_path, str) and url_or_path.startswith(("postgresql://", "postgres://"))


async def connect_store(url_or_path: str | Path, *, statement_timeout: float = 10.0) -> SqlStore:
    """Open the store named by the config's ``store`` value; the caller must ``aclose()`` it.

    ``postgresql://…`` (or ``postgres://…``) selects PostgreSQL; anything else is a SQLite file
    path (an optional ``sqlite://`` prefix is stripped).
    """
    if is_postgres_url(url_or_path):
        return await PostgresStore.open(str(url_or_path), statement_timeout=statement_timeout)
    path = str(url_or_path)
    if path.startswith("sqlite://"):
        path = path.removeprefix("sqlite://")
    return await SqliteStore.open(path, busy_timeout=statement_timeout)


@asynccontextmanager
async def open_store(url_or_path: str | Path, *, statement_timeout: float = 10.0) -> AsyncIterator[Store]:
    """``async with open_store(url) as store:`` — ``connect_store`` scoped to a block."""
    store = await connect_store(url_or_path, statement_timeout=statement_timeout)
    try:
        yield store
    finally:
        await store.aclose()


def _conforms(store: SqlStore) -> Store:
    # mypy checks here that SqlStore implements the Store protocol.
    return store
