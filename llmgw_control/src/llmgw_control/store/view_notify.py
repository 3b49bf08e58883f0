"""PostgreSQL ``LISTEN/NOTIFY`` for the replica view: a standby hears a new revision at once.

The leader's ``publish_view`` calls ``pg_notify(VIEW_CHANNEL, revision)`` in the transaction that
writes the view row, so the notification is delivered at COMMIT, never before the row is
visible and never for a write that rolled back. ``ViewListener`` holds one dedicated connection
that LISTENs and tells the follower (fleet/view.py) when to read:

* after every (re)connect, once LISTEN is in place: a full read, because anything published
  while the connection was down was not heard;
* on every notification whose payload is a revision number. The payload is hostile (anyone
  with access to the database can NOTIFY this channel): it is never parsed as anything but a
  bounded decimal integer, it carries no key or replica, and it only ever triggers a read of
  the row, which stays the truth. Anything else is counted and ignored.

psycopg's async connection does not run under trio (its waits call asyncio's
``get_running_loop``), so the connection is the sync one, used only from a worker thread, one
bounded wait at a time (``_WAIT_SLICE``); a cancelled wait abandons the thread, which closes the
connection when its slice ends (``_abandon``), so cancelling the follower returns at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
import trio

from llmgw_shared.threads import STORE

from ._abandon import Loan, run_abandonable
from .errors import StoreError

log = logging.getLogger(__name__)

# One channel per database (each llmgw cluster has its own database). Shared SQL forbids '%',
# and a channel is an identifier: lower case, no quoting needed.
VIEW_CHANNEL = "llmgw_replica_view"
# How long one blocking wait in a thread may last: the bound on how long an abandoned thread
# keeps its connection after a cancel, and on how late a broken socket that sends nothing
# (keepalives catch a silent one) is noticed.
_WAIT_SLICE = 1.0
# After a lost or refused connection, the wait before the next attempt, doubled up to the cap:
# a database that is down must not be hammered by every standby, and one that is back is found
# within the cap (the safety poll covers the gap meanwhile).
_RETRY_FIRST = 0.2
_RETRY_CAP = 5.0
# A revision is a bigint: more digits than this is not one (and bounds what int() is given).
_MAX_REVISION_DIGITS = 19


def parse_revision(payload: object) -> int | None:
    """The revision a payload names, or None when it is not a plain non-negative integer."""
    if not isinstance(payload, str) or not 0 < len(payload) <= _MAX_REVISION_DIGITS:
        return None
    if not (payload.isascii() and payload.isdigit()):
        return None
    return int(payload)


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.close()
    except Exception:  # a broken connection may fail to close; it is gone either way
        log.debug("closing the LISTEN connection failed", exc_info=True)


def _wait(loan: Loan[psycopg.Connection[Any]]) -> list[str]:
    """In a thread: the payloads that arrive within one slice (empty when none did)."""
    conn = loan.resource
    assert conn is not None
    return [n.payload for n in conn.notifies(timeout=_WAIT_SLICE, stop_after=1) if n.channel == VIEW_CHANNEL]


class ViewListener:
    """Calls ``on_change(None)`` after each (re)connect and ``on_change(revision)`` per notification.

    ``connect`` opens an autocommit connection (``PostgresBackend.listen_connection``); tests
    pass their own to hold a reconnect back.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        self._connect = connect
        self.connects = 0  # connections that reached LISTEN (for tests and logs)
        self.losses = 0  # connections lost after LISTEN
        self.ignored = 0  # notifications whose payload was not a revision
        self.listening = False  # LISTEN in place now: while not, the follower polls as on SQLite

    def _open(self) -> psycopg.Connection[Any]:
        conn = self._connect()
        try:
            conn.execute(f"LISTEN {VIEW_CHANNEL}")
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    async def _open_abandonable(self) -> psycopg.Connection[Any]:
        loan: Loan[psycopg.Connection[Any]] = Loan(None, _close_quietly)

        def work(ln: Loan[psycopg.Connection[Any]]) -> psycopg.Connection[Any]:
            ln.resource = self._open()
            return ln.resource

        return await run_abandonable(loan, work)

    async def run(self, on_change: Callable[[int | None], None]) -> None:
        """Listen until cancelled, reconnecting after every loss."""
        delay = _RETRY_FIRST
        while True:
            try:
                conn = await self._open_abandonable()
            except (psycopg.Error, StoreError) as exc:
                log.warning("cannot LISTEN for replica view changes (%s): retrying in %.1f s", exc, delay)
                await trio.sleep(delay)
                delay = min(delay * 2, _RETRY_CAP)
                continue
            delay = _RETRY_FIRST
            self.connects += 1
            self.listening = True
            on_change(None)  # LISTEN is in place: one full read covers whatever came before
            try:
                await self._listen(conn, on_change)
            except Exception as exc:  # psycopg's, or anything odd: a standby must keep following
                log.warning(
                    "the LISTEN connection for replica view changes broke (%s): reconnecting",
                    exc,
                    exc_info=not isinstance(exc, psycopg.Error),
                )
            finally:
                self.listening = False
            self.losses += 1
            await trio.sleep(_RETRY_FIRST)

    async def _listen(self, conn: psycopg.Connection[Any], on_change: Callable[[int | None], None]) -> None:
        owned = True
        try:
            while True:
                # A loan per wait: it records whether this wait's thread or this task closes.
                loan = Loan(conn, _close_quietly)
                try:
                    payloads = await run_abandonable(loan, _wait)
                except BaseException:
                    # Cancelled mid-wait: the thread owns the connection and closes it when its
                    # slice ends. Broken: it is still ours to close.
                    owned = not loan.abandoned
                    raise
                for payload in payloads:
                    revision = parse_revision(payload)
                    if revision is None:
                        self.ignored += 1
                        log.debug("ignoring a replica view notification that names no revision")
                        continue
                    on_change(revision)
        finally:
            if owned:
                with trio.CancelScope(shield=True):  # closing is quick, and must happen
                    await STORE.run(_close_quietly, conn)
