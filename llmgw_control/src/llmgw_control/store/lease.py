"""The leader lease in the database: one row, compare-and-set, an epoch as fencing token.

Every operation is one atomic statement judged by the database's clock (PostgreSQL's
``clock_timestamp()``; on SQLite the process clock, which is the only clock there is), read
once per statement through ``UPDATE … FROM``, which both databases accept:

* ``try_acquire`` takes the lease if it has expired or is already ours. The epoch goes up
  unless this is the holder extending a lease that is still live, so every new term (another
  holder, or us again after our lease lapsed or was given up) gets a new, larger epoch.
* ``renew`` extends the lease only if it is ours *and still live*: a holder whose lease lapsed
  must step down and acquire again, which gives it a new epoch.
* ``give_up`` gives it up at once, so a standby can take over on its next poll.

Holders must be unique per process start (e.g. ``host:pid:random``), or a restarted daemon
would inherit its predecessor's live term.
"""

from __future__ import annotations

from typing import Protocol

from . import convert as cv
from .backend import Backend, Tx
from .errors import InvalidInput
from .ops_audit import leadership_row
from .ops_base import ONE_CLOCK
from .records import LeaseGrant, LeaseInfo
from .transactions import TransactionCounts, run_transaction


class Lease(Protocol):
    """What ``LeaseKeeper`` needs; ``SqlLease`` implements it, tests use fakes."""

    async def try_acquire(self, holder: str, address: str, ttl: float) -> LeaseGrant | None: ...

    async def renew(self, holder: str, ttl: float) -> LeaseGrant | None: ...

    async def give_up(self, holder: str) -> bool: ...

    async def current(self) -> LeaseInfo: ...


def _ttl_us(ttl: float) -> int:
    value = cv.number("ttl", ttl)
    if value <= 0:
        raise InvalidInput("ttl", "must be positive")
    return int(value * 1_000_000)


class SqlLease:
    def __init__(self, backend: Backend, counts: TransactionCounts | None = None) -> None:
        self._backend = backend
        self._counts = counts if counts is not None else TransactionCounts()

    async def try_acquire(self, holder: str, address: str, ttl: float) -> LeaseGrant | None:
        """Take the lease for ``ttl`` seconds if it is free (expired/given up) or ours."""
        holder = cv.name("holder", holder)
        address = cv.text("address", address)
        ttl_us = _ttl_us(ttl)

        def acquire(tx: Tx) -> LeaseGrant | None:
            before = tx.one("SELECT holder, epoch FROM leader_lease WHERE id = 1")
            row = tx.one(
                "UPDATE leader_lease SET "
                "epoch = CASE WHEN holder = ? AND expires_at > clock.t THEN epoch ELSE epoch + 1 END, "
                "holder = ?, address = ?, expires_at = clock.t + ? "
                f"FROM {ONE_CLOCK} "
                "WHERE id = 1 AND (expires_at <= clock.t OR holder = ?) "
                "RETURNING epoch, expires_at",
                (holder, holder, address, ttl_us, holder),
            )
            if row is None:
                return None
            if before is not None and int(row[0]) != int(before[1]):
                # A new epoch is a change of leadership: recorded in the transaction that made it.
                leadership_row(
                    tx,
                    holder,
                    "leadership.acquire",
                    {"holder": before[0], "epoch": int(before[1])},
                    {"holder": holder, "address": address, "epoch": int(row[0])},
                )
            return LeaseGrant(epoch=int(row[0]), expires_at=cv.from_us(row[1]))

        return await run_transaction(self._backend, self._counts, acquire, write=True)

    async def renew(self, holder: str, ttl: float) -> LeaseGrant | None:
        """Extend our live lease to now + ``ttl``; None if it lapsed or someone else holds it."""
        holder = cv.name("holder", holder)
        ttl_us = _ttl_us(ttl)

        def renew(tx: Tx) -> LeaseGrant | None:
            row = tx.one(
                f"UPDATE leader_lease SET expires_at = clock.t + ? FROM {ONE_CLOCK} "
                "WHERE id = 1 AND holder = ? AND expires_at > clock.t "
                "RETURNING epoch, expires_at",
                (ttl_us, holder),
            )
            return None if row is None else LeaseGrant(epoch=int(row[0]), expires_at=cv.from_us(row[1]))

        return await run_transaction(self._backend, self._counts, renew, write=True)

    async def give_up(self, holder: str) -> bool:
        """Give the lease up if ``holder`` has it; True if it did. The epoch is kept."""
        holder = cv.name("holder", holder)

        def give_up(tx: Tx) -> bool:
            changed = tx.run(
                "UPDATE leader_lease SET holder = NULL, address = NULL, expires_at = 0 WHERE id = 1 AND holder = ?",
                (holder,),
            )
            if changed:
                leadership_row(tx, holder, "leadership.release", {"holder": holder}, {"holder": None})
            return changed > 0

        return await run_transaction(self._backend, self._counts, give_up, write=True)

    async def current(self) -> LeaseInfo:
        """Who leads now: holder and address are None when the lease is free or has lapsed."""

        def current(tx: Tx) -> LeaseInfo:
            row = tx.one(
                f"SELECT holder, address, epoch, expires_at, clock.t FROM leader_lease, {ONE_CLOCK} WHERE id = 1"
            )
            assert row is not None
            holder, address, epoch, expires_at, now = row
            if holder is None or expires_at <= now:
                return LeaseInfo(holder=None, address=None, epoch=int(epoch), expires_at=None)
            return LeaseInfo(holder=holder, address=address, epoch=int(epoch), expires_at=cv.from_us(expires_at))

        return await run_transaction(self._backend, self._counts, current, write=False)
