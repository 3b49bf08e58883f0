"""An in-memory lease on trio's clock, for tests of code that runs a ``LeaseKeeper``.

Real stores run their statements in worker threads, and ``autojump_clock`` jumps ahead while a
thread works, so fake-time tests of leadership should use this instead: ``LeaseRow`` is the
shared row (one per simulated database), ``MemoryLease`` one daemon's connection to it, whose
``hang``/``fail`` switches break only that daemon's access. Semantics match ``SqlLease``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import attrs
import trio

from .errors import StoreUnavailable
from .records import LeaseGrant, LeaseInfo


@attrs.define
class LeaseRow:
    """The lease row, with ``expires`` on trio's clock (seconds)."""

    holder: str | None = None
    address: str | None = None
    epoch: int = 0
    expires: float = 0.0

    def live(self) -> bool:
        return self.holder is not None and trio.current_time() < self.expires

    def grant(self) -> LeaseGrant:
        # trio's clock is not wall time; the datetime is only informational here.
        return LeaseGrant(epoch=self.epoch, expires_at=datetime.fromtimestamp(self.expires, UTC))


class MemoryLease:
    """One daemon's view of a ``LeaseRow``; implements ``lease.Lease``."""

    def __init__(self, row: LeaseRow, *, round_trip: float = 0.001) -> None:
        self.row = row
        self.round_trip = round_trip
        self.hang = False  # every call blocks until cancelled (a frozen connection)
        self.fail = False  # every call raises StoreUnavailable (a refused connection)
        self.calls = 0

    async def _gate(self) -> None:
        self.calls += 1
        await trio.sleep(self.round_trip)
        if self.fail:
            raise StoreUnavailable("connection refused (MemoryLease.fail)")
        if self.hang:
            await trio.sleep_forever()

    async def try_acquire(self, holder: str, address: str, ttl: float) -> LeaseGrant | None:
        await self._gate()
        row = self.row
        if row.live() and row.holder != holder:
            return None
        if not (row.live() and row.holder == holder):
            row.epoch += 1
        row.holder, row.address, row.expires = holder, address, trio.current_time() + ttl
        return row.grant()

    async def renew(self, holder: str, ttl: float) -> LeaseGrant | None:
        await self._gate()
        if not (self.row.live() and self.row.holder == holder):
            return None
        self.row.expires = trio.current_time() + ttl
        return self.row.grant()

    async def give_up(self, holder: str) -> bool:
        await self._gate()
        if self.row.holder != holder:
            return False
        self.row.holder = self.row.address = None
        self.row.expires = 0.0
        return True

    async def current(self) -> LeaseInfo:
        await self._gate()
        row = self.row
        if not row.live():
            return LeaseInfo(holder=None, address=None, epoch=row.epoch, expires_at=None)
        return LeaseInfo(holder=row.holder, address=row.address, epoch=row.epoch, expires_at=row.grant().expires_at)
