"""The PostgreSQL backend: psycopg 3's sync API in worker threads, a small connection pool.

psycopg's async connection does not run under trio, and trio cannot interrupt a thread, so:
every connection gets a ``statement_timeout`` (a query cannot outlive it on the server side),
TCP keepalives and ``tcp_user_timeout`` (a cut network is noticed by the client too), and a
cancelled caller abandons the thread, whose connection is then closed instead of reused.
A connection found broken is dropped; the next call connects afresh. A call that fails on a
*reused* connection before COMMIT is retried once on a new one: nothing was committed, and the
usual cause is a server restart while the connection sat idle.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg.errors
import trio

from llmgw_shared.threads import STORE

from ._abandon import Loan, run_abandonable
from .backend import Row, Tx
from .errors import Conflict, StoreClosed, StoreError, StoreTimeout, StoreUnavailable

T = TypeVar("T")
log = logging.getLogger(__name__)

# The dedicated LISTEN connections, told apart in pg_stat_activity (and by the tests that cut them).
LISTEN_APPLICATION_NAME = "llmgw-control-listen"

# The database's clock, in the integer microseconds the schema uses. clock_timestamp(), not
# now(): now() is frozen at the start of the transaction.
_PG_NOW = "(extract(epoch from clock_timestamp()) * 1000000)::bigint"


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> str:
    """Shared SQL → psycopg: ``?`` placeholders become ``%s``, ``now_us()`` the server clock."""
    if "%" in sql:
        raise ValueError("shared SQL must not contain '%' (psycopg would read it as a placeholder)")
    return sql.replace("?", "%s").replace("now_us()", _PG_NOW)


class _PgTx:
    dialect = "postgresql"

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    def _execute(self, sql: str, params: Sequence[object]) -> psycopg.Cursor[Any]:
        try:
            return self._cur.execute(translate(sql), tuple(params))
        except psycopg.errors.IntegrityError as exc:
            raise Conflict(f"the change violates a constraint: {exc.diag.message_primary}") from None

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        cur = self._execute(sql, params)
        return cur.fetchall() if cur.description is not None else []

    def one(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        cur = self._execute(sql, params)
        row: Row | None = cur.fetchone() if cur.description is not None else None
        return row

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        return self._execute(sql, params).rowcount


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.close()
    except Exception:  # closing a broken connection may fail; it is gone either way
        log.debug("closing a PostgreSQL connection failed", exc_info=True)


class PostgresBackend:
    dialect = "postgresql"

    def __init__(
        self,
        conninfo: str,
        *,
        pool_size: int = 4,
        statement_timeout: float = 10.0,
        connect_timeout: float = 5.0,
    ) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self._conninfo = conninfo
        self._statement_timeout_ms = max(1, int(statement_timeout * 1000))
        self._connect_timeout = max(2, int(connect_timeout))  # libpq ignores values below 2
        self._slots = trio.Semaphore(pool_size)
        self._idle: list[psycopg.Connection[Any]] = []
        self._closed = False

    def _connect(self, *, listen: bool = False) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(
                self._conninfo,
                # A LISTEN connection must not sit in a transaction: notifications are delivered
                # only between transactions, and an idle one would be ended by the server.
                autocommit=listen,
                connect_timeout=self._connect_timeout,
                application_name=LISTEN_APPLICATION_NAME if listen else "llmgw-control",
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
                tcp_user_timeout=self._statement_timeout_ms + 5000,
            )
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from None
        try:
            # Session settings, set once per connection. A statement in a thread cannot be
            # cancelled from trio, so the server must end it; an abandoned transaction must not
            # hold locks for long either.
            conn.execute(f"SET statement_timeout = {self._statement_timeout_ms}")
            conn.execute(f"SET lock_timeout = {self._statement_timeout_ms}")
            conn.execute(f"SET idle_in_transaction_session_timeout = {self._statement_timeout_ms * 3}")
            conn.execute("SET TIME ZONE 'UTC'")
            if not listen:
                conn.commit()
        except psycopg.Error as exc:
            _close_quietly(conn)
            raise StoreUnavailable(f"cannot set up a PostgreSQL session: {exc}") from None
        return conn

    def listen_connection(self) -> psycopg.Connection[Any]:
        """A new autocommit connection outside the pool, for LISTEN (store/view_notify.py); blocking."""
        return self._connect(listen=True)

    def _work(self, loan: Loan[psycopg.Connection[Any]], fn: Callable[[Tx], T]) -> T:
        for attempt in (1, 2):
            fresh = loan.resource is None
            if loan.resource is None:
                loan.resource = self._connect()
            conn = loan.resource
            try:
                with conn.cursor() as cur:
                    result = fn(_PgTx(cur))
            except BaseException as exc:
                if conn.broken or conn.closed:
                    _close_quietly(conn)
                    loan.resource = None
                    if isinstance(exc, psycopg.OperationalError):
                        if attempt == 1 and not fresh:
                            log.info("PostgreSQL connection was broken; retrying on a new one")
                            continue
                        raise StoreUnavailable(f"the PostgreSQL connection broke: {exc}") from None
                    raise
                try:
                    conn.rollback()
                except psycopg.Error:
                    _close_quietly(conn)
                    loan.resource = None
                if isinstance(exc, psycopg.Error):
                    raise _translate(exc) from None
                raise
            try:
                conn.commit()
            except psycopg.Error as exc:
                if conn.broken or conn.closed:
                    _close_quietly(conn)
                    loan.resource = None
                    raise StoreUnavailable(
                        f"the PostgreSQL connection broke during COMMIT; the outcome is unknown: {exc}"
                    ) from None
                raise _translate(exc) from None
            return result
        raise AssertionError("unreachable")

    async def run(self, fn: Callable[[Tx], T], *, write: bool) -> T:
        if self._closed:
            raise StoreClosed("the store is closed")
        async with self._slots:
            loan = Loan(self._idle.pop() if self._idle else None, _close_quietly)
            try:
                return await run_abandonable(loan, lambda ln: self._work(ln, fn))
            finally:
                if not loan.abandoned and loan.resource is not None:
                    if self._closed:
                        _close_quietly(loan.resource)
                    else:
                        self._idle.append(loan.resource)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []

        def close_all() -> None:
            for conn in idle:
                _close_quietly(conn)

        if idle:
            await STORE.run(close_all)


def _translate(exc: BaseException) -> BaseException:
    """Turn a psycopg error into the store's own; anything else passes through unchanged."""
    if isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
        return StoreTimeout(f"PostgreSQL gave up on a statement: {exc}")
    if isinstance(exc, psycopg.OperationalError):
        return StoreUnavailable(f"PostgreSQL error: {exc}")
    if isinstance(exc, psycopg.Error):
        return StoreError(f"PostgreSQL error: {exc}")
    return exc
