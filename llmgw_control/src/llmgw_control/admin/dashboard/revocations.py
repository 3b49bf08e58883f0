"""Which dashboard sessions were ended on the server: the store's ``session_revocations``, in memory.

Sessions are signed cookies, valid until they expire; ending one earlier needs every control
daemon to know it is void. The store keeps that (``store/ops_sessions.py``): a user's (or an
admin key's) sessions issued before a time, or one session a logout ended. Every session load
checks this object's copy of those rows, so a request costs no store read: the copy is read
again every ``REFRESH_S``. A revocation made through this daemon applies here at once; one made
through another daemon on the same database applies here within ``REFRESH_S`` (plus one store
read's time). While the store cannot be read the last copy stays in force (logged).

Times compare the issuing daemon's clock with the revoking daemon's: hosts keep their clocks in
step (NTP), as the leader lease already requires.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import trio

from llmgw_shared.logs import get_logger

from ...store import StoreError
from .session import DEFAULT_LIFETIME, Session

if TYPE_CHECKING:
    from ...store import Store

log = get_logger(__name__)

# How stale the copy may be: a revocation made through another daemon ends sessions here within
# this long. Two seconds is quicker than an operator can switch windows to check, and one small
# indexed read every two seconds per daemon is nothing to the store.
REFRESH_S = 2.0
# One read of the rows may take this long; a sick store leaves the last copy in force.
READ_DEADLINE_S = 5.0


def user_subject(user: str) -> str:
    return f"user:{user}"


def key_subject(key_id: str) -> str:
    return f"key:{key_id}"


def session_subject(session: Session) -> str:
    return f"session:{session.session_id}"


class SessionRevocations:
    def __init__(
        self, store: Store | None, *, lifetime: float = DEFAULT_LIFETIME, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        # Sessions last at most this long: a revocation is useless after it.
        self.lifetime = lifetime
        self._clock = clock
        # subject → sessions issued before this time (Unix seconds) are void
        self._void_before: dict[str, float] = {}
        self.loaded_at: float | None = None

    def voids(self, session: Session, actor: str) -> bool:
        """Whether ``session`` (whose operator is ``actor``: ``user:…`` or ``key:…``) was ended."""
        for subject in (actor, session_subject(session)):
            cut = self._void_before.get(subject)
            if cut is not None and session.issued_at < cut:
                return True
        return False

    async def revoke(self, subject: str, *, until: float | None = None) -> datetime:
        """Void ``subject``'s sessions issued until now, in the store and here; when they are void from."""
        if self.store is None:
            raise StoreError("there is no store to record the revocation in")
        now = self._clock()
        end = until if until is not None else now + self.lifetime
        cut = await self.store.revoke_sessions(
            subject, before=datetime.fromtimestamp(now, UTC), until=datetime.fromtimestamp(max(end, now), UTC)
        )
        self._void_before[subject] = max(self._void_before.get(subject, 0.0), cut.timestamp())
        return cut

    async def refresh(self) -> None:
        if self.store is None:
            return
        with trio.fail_after(READ_DEADLINE_S):
            rows = await self.store.session_revocations(datetime.fromtimestamp(self._clock(), UTC))
        fresh = {subject: cut.timestamp() for subject, cut in rows.items()}
        # A revocation made here since the read began is kept (the read may predate its commit).
        for subject, cut in self._void_before.items():
            if cut > fresh.get(subject, 0.0) and cut > self._clock() - self.lifetime:
                fresh[subject] = max(cut, fresh.get(subject, 0.0))
        self._void_before = fresh
        self.loaded_at = self._clock()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the copy fresh; every daemon runs it (a read). The daemon reads once before it
        serves (``refresh_or_log``), so it does not honour ended sessions for its first moments."""
        task_status.started()
        while True:
            await trio.sleep(REFRESH_S)
            await self.refresh_or_log()

    async def refresh_or_log(self) -> None:
        try:
            await self.refresh()
        except (StoreError, trio.TooSlowError) as exc:
            log.warning("could not read the ended dashboard sessions (the last copy stays): %s", exc)
