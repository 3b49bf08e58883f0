"""The admin side of the audit log: who is acting, refusals (rate-limited), retention.

The rows of changes are written by the store itself (``store/audit_scope.py``): the admin API
opens an ``AuditScope`` around every state-changing request (``api/core.py``) and every store
write made under it records itself in its own transaction. This module supplies the scope's
who and where, writes the row of an action that changed nothing stored (a drain acts on the
fleet in memory), records refused admin requests, and deletes rows past their retention.

Actors: ``key:<id>`` (an admin key, checked by ``AdminKeyGuard`` or the dashboard's session),
``user:<name>`` (a dashboard user signed in through OpenID Connect), ``loopback`` (the admin
listener on loopback without keys, where whoever can connect is trusted).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import trio

from llmgw_shared.logs import get_logger

from ..store import AuditScope, StoreError
from .org_config import AuditConfig

if TYPE_CHECKING:
    from ..store import Store

log = get_logger(__name__)

# Set on the request's head by the layer that checked the caller (AdminKeyGuard, the dashboard),
# never taken from the client: both drop any copy a client sent.
ACTOR_HEADER = b"x-llmgw-admin-actor"
LOOPBACK = "loopback"
# A row that cannot be written in this long is given up (logged): the answer must not wait on a
# sick database longer than the admin API's own store calls would.
WRITE_DEADLINE_S = 10.0
PRUNE_EVERY_S = 3600.0


def peer_of(scope: Mapping[str, Any] | Any) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


class AuditLog:
    def __init__(
        self, store: Store | None, config: AuditConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.config = config or AuditConfig()
        self._clock = clock
        self._window_start = clock()
        self._in_window = 0
        self.refusals_dropped = 0

    def begin(self, *, actor: str, peer: str, action: str, resource: str, resource_id: str) -> AuditScope:
        return AuditScope(
            actor=actor[:200], peer=peer[:200], action=action, resource=resource, resource_id=resource_id[:200]
        )

    async def finish(self, scope: AuditScope) -> None:
        """After a successful action: its row, if none of its writes wrote one (nothing stored changed)."""
        if scope.row_id is not None or self.store is None:
            return
        await self._write(
            actor=scope.actor,
            peer=scope.peer,
            action=scope.action,
            outcome="ok",
            resource=scope.resource,
            resource_id=scope.resource_id,
            changes=[],
        )

    async def refused(self, *, actor: str, peer: str, action: str, reason: str) -> None:
        """A refused admin request, unless this minute's allowance is spent (then only counted)."""
        if self.store is None:
            return
        now = self._clock()
        if now - self._window_start >= 60:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self.config.refusals_per_minute:
            self.refusals_dropped += 1
            return
        self._in_window += 1
        dropped, self.refusals_dropped = self.refusals_dropped, 0
        changes = [
            {
                "resource": "admin",
                "id": "",
                "op": "refused",
                "before": None,
                "after": {"reason": reason[:200], **({"not_recorded_before": dropped} if dropped else {})},
            }
        ]
        await self._write(
            actor=actor,
            peer=peer,
            action=action[:200],
            outcome="refused",
            resource="admin",
            resource_id="",
            changes=changes,
        )

    async def _write(self, **row: Any) -> None:
        assert self.store is not None
        with trio.move_on_after(WRITE_DEADLINE_S) as deadline:
            try:
                await self.store.record_audit(**row)
            except StoreError as exc:
                log.error("could not write an audit row: %s", exc, extra={"action": row["action"]})
        if deadline.cancelled_caught:
            log.error("could not write an audit row in %.0f s", WRITE_DEADLINE_S, extra={"action": row["action"]})

    async def prune_once(self, now: datetime | None = None) -> int:
        if self.store is None or self.config.retention_days == 0:
            return 0
        cut = (now or datetime.now(UTC)) - timedelta(days=self.config.retention_days)
        return await self.store.prune_audit(cut)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Delete rows past their retention, hourly. Every daemon may run it: the DELETE is idempotent."""
        task_status.started()
        while True:
            with trio.move_on_after(60):
                try:
                    gone = await self.prune_once()
                    if gone:
                        log.info("audit rows past their retention deleted", extra={"rows": gone})
                except StoreError as exc:
                    log.warning("could not prune the audit log: %s", exc)
            await trio.sleep(PRUNE_EVERY_S)
