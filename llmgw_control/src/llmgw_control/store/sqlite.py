"""The SQLite backend: one file, WAL, one connection shared by worker threads under a lock.

SQLite allows one writer at a time anyway, so a single connection costs nothing and keeps
transactions simple. Writes start with ``BEGIN IMMEDIATE`` so that a second process on the same
file waits (``busy_timeout``) instead of failing halfway through a read-then-write transaction.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import trio

from llmgw_shared.threads import STORE

from .backend import Row, Tx
from .errors import Conflict, StoreClosed, StoreError, StoreTimeout, StoreUnavailable

T = TypeVar("T")


class _SqliteTx:
    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _execute(self, sql: str, params: Sequence[object]) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, tuple(params))
        except sqlite3.IntegrityError as exc:
            raise Conflict(f"the change violates a constraint: {exc}") from None
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise StoreTimeout(f"the SQLite database stayed locked: {exc}") from None
            raise StoreError(f"SQLite error: {exc}") from exc

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        return self._execute(sql, params).fetchall()

    def one(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        row: Row | None = self._execute(sql, params).fetchone()
        return row

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        return self._execute(sql, params).rowcount


def _enable_wal(conn: sqlite3.Connection, patience: float) -> tuple[object, ...] | None:
    """Switch to WAL, retrying while another connection holds the file.

    Entering WAL needs an exclusive lock, and SQLite may answer "database is locked" at once
    instead of calling the busy handler (to avoid a lock-upgrade deadlock): seen when daemons
    open a fresh file together.
    """
    deadline = time.monotonic() + patience
    while True:
        try:
            row: tuple[object, ...] | None = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return row
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)  # in the opening worker thread, not the trio loop


class SqliteBackend:
    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()
        # Which call's work holds the connection now; guarded by _running_lock so that a
        # cancelled caller interrupts its own statement and never the next caller's.
        self._running: object | None = None
        self._running_lock = threading.Lock()

    @classmethod
    async def connect(
        cls, path: str | Path, *, busy_timeout: float = 5.0, clock: Callable[[], float] = time.time
    ) -> SqliteBackend:
        def open_db() -> sqlite3.Connection:
            try:
                # isolation_level=None: we issue BEGIN/COMMIT ourselves (the module's implicit
                # transactions do not cover DDL and cannot do BEGIN IMMEDIATE).
                conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
                conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
                mode = _enable_wal(conn, busy_timeout)
                # NORMAL is durable against a crash of the process in WAL mode; only a power
                # loss can drop the last transactions (see docs/store.md).
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("PRAGMA foreign_keys = ON")
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"cannot open SQLite database {str(path)!r}: {exc}") from None
            if mode is None or str(mode[0]).lower() != "wal":
                conn.close()
                raise StoreUnavailable(f"SQLite database {str(path)!r} cannot use WAL mode (got {mode})")
            # The process clock stands in for the database clock (SQLite has none of its own
            # that a second process could share meaningfully); tests inject a fake one.
            conn.create_function("now_us", 0, lambda: int(clock() * 1_000_000))
            return conn

        return cls(await STORE.run(open_db))

    async def run(self, fn: Callable[[Tx], T], *, write: bool) -> T:
        token = object()

        def work() -> T:
            with self._lock:
                conn = self._conn
                if conn is None:
                    raise StoreClosed("the store is closed")
                with self._running_lock:
                    self._running = token
                try:
                    return self._transaction(conn, fn, write)
                finally:
                    with self._running_lock:
                        self._running = None

        try:
            # Abandoning is safe: the thread keeps the lock until it has committed or rolled
            # back, so the shared connection is never reused mid-transaction.
            return await STORE.run(work, abandon=True)
        except trio.Cancelled:
            # Do not let an abandoned statement hold the only connection: stop it (SQLite
            # rolls the transaction back), so the next caller does not wait for it.
            with self._running_lock:
                if self._running is token and self._conn is not None:
                    self._conn.interrupt()
            raise

    @staticmethod
    def _transaction(conn: sqlite3.Connection, fn: Callable[[Tx], T], write: bool) -> T:
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.OperationalError as exc:
            raise StoreTimeout(f"the SQLite database stayed locked: {exc}") from None
        try:
            result = fn(_SqliteTx(conn))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    async def aclose(self) -> None:
        def close() -> None:
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await STORE.run(close)
