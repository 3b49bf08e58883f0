"""A store's lease that counts a LeaseKeeper's attempts: the pass counter for "nothing changed" checks.

A fixed sleep before asserting that a leader kept its lead can end, on a loaded machine, before a
single renew ran, and pass without checking anything; waiting for a number of attempts cannot.
"""

from __future__ import annotations

from llmgw_control.store.lease import Lease, LeaseGrant, LeaseInfo
from support.waiting import wait_until

# Generous bound on waiting for a number of attempts; reached in a second or two when idle.
ATTEMPTS_WAIT_S = 60.0


class CountedLease:
    """``lease``, counting every acquire or renew attempt that ended (granted, refused or failed)."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self.attempts = 0

    async def try_acquire(self, holder: str, address: str, ttl: float) -> LeaseGrant | None:
        try:
            return await self._lease.try_acquire(holder, address, ttl)
        finally:
            self.attempts += 1

    async def renew(self, holder: str, ttl: float) -> LeaseGrant | None:
        try:
            return await self._lease.renew(holder, ttl)
        finally:
            self.attempts += 1

    async def give_up(self, holder: str) -> bool:
        return await self._lease.give_up(holder)

    async def current(self) -> LeaseInfo:
        return await self._lease.current()

    async def more_attempts(self, count: int) -> None:
        """Return once ``count`` more attempts than now have ended."""
        target = self.attempts + count

        async def reached() -> bool:
            return self.attempts >= target

        await wait_until(reached, timeout=ATTEMPTS_WAIT_S)
