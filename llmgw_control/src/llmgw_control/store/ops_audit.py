"""The audit log's rows: written with the change they describe, read newest first, pruned by age.

One row per admin action (see ``audit_scope``): the first write of the action inserts it in the
write's own transaction, later writes of the same action update it (adding their changes), so
the row and every change it names commit together. Actions that change no stored state (a
drain, a pull cancelled before it was saved) and refused actions get their row from
``record_audit``, in a transaction of its own.

Pages are newest first; the cursor is the last row's ``(at, id)``, opaque to callers.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from . import convert as cv
from .audit_scope import MAX_CHANGES, AuditScope, change_entry
from .backend import Row, Tx
from .errors import InvalidInput
from .ops_base import OpsBase, new_id
from .records import AuditEntry, AuditPage

_COLUMNS = "id, at, actor, peer, action, outcome, resource, resource_id, changes"
# The most rows one page returns: enough for a screen, small enough to answer quickly.
MAX_PAGE = 500


def _entry(row: Row) -> AuditEntry:
    return AuditEntry(
        id=row[0],
        at=cv.from_us(row[1]),
        actor=row[2],
        peer=row[3],
        action=row[4],
        outcome=row[5],
        resource=row[6],
        resource_id=row[7],
        changes=json.loads(row[8]),
    )


def _bounded(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(changes) <= MAX_CHANGES:
        return changes
    return [
        *changes[:MAX_CHANGES],
        {
            "resource": "audit",
            "id": "",
            "op": "truncated",
            "before": None,
            "after": {"left_out": len(changes) - MAX_CHANGES},
        },
    ]


def write_scope_row(tx: Tx, scope: AuditScope, notes: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Insert (first write) or update (later writes) the scope's row in ``tx``; its id and changes.

    Returns the new state rather than changing ``scope``: the caller applies it once the
    transaction has committed, so a rolled-back write leaves the scope as it was.
    """
    changes = _bounded([*scope.changes, *notes])
    text = json.dumps(changes, sort_keys=True, default=str)
    # The row names the first thing the action changed; an unnamed write ("store") defers to
    # the route's own resource and id.
    first = next((c for c in changes if c.get("resource") not in (None, "store", "audit")), None)
    resource = str(first["resource"]) if first is not None else scope.resource
    resource_id = str(first["id"]) if first is not None else scope.resource_id
    if scope.row_id is None:
        row_id = new_id()
        tx.run(
            f"INSERT INTO audit_log ({_COLUMNS}) VALUES (?, now_us(), ?, ?, ?, 'ok', ?, ?, ?)",
            (row_id, scope.actor, scope.peer, scope.action, resource, resource_id, text),
        )
        return row_id, changes
    tx.run("UPDATE audit_log SET changes = ? WHERE id = ?", (text, scope.row_id))
    return scope.row_id, changes


def insert_row(
    tx: Tx,
    *,
    actor: str,
    peer: str,
    action: str,
    outcome: str,
    resource: str,
    resource_id: str,
    changes: list[dict[str, Any]],
) -> str:
    row_id = new_id()
    text = json.dumps(_bounded(changes), sort_keys=True, default=str)
    tx.run(
        f"INSERT INTO audit_log ({_COLUMNS}) VALUES (?, now_us(), ?, ?, ?, ?, ?, ?, ?)",
        (row_id, actor[:200], peer[:200], action[:200], outcome, resource[:200], resource_id[:200], text),
    )
    return row_id


def _cursor(text: str) -> tuple[int, str]:
    at, colon, row_id = text.partition(":")
    if not colon or not at.isdigit() or len(at) > 20 or not row_id or len(row_id) > 64:
        raise InvalidInput("cursor", "not a cursor this server gave out")
    return int(at), row_id


class AuditOps(OpsBase):
    async def record_audit(
        self,
        *,
        actor: str,
        peer: str,
        action: str,
        outcome: str,
        resource: str,
        resource_id: str,
        changes: list[dict[str, Any]] | None = None,
    ) -> str:
        """Write one row in a transaction of its own (an action with no stored change, a refusal)."""
        if outcome not in ("ok", "refused"):
            raise InvalidInput("outcome", "must be ok or refused")
        entries = changes if changes is not None else []
        return await self._write_unaudited(
            lambda tx: insert_row(
                tx,
                actor=actor,
                peer=peer,
                action=action,
                outcome=outcome,
                resource=resource,
                resource_id=resource_id,
                changes=entries,
            )
        )

    async def list_audit(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        actor: str | None = None,
        resource: str | None = None,
        resource_id: str | None = None,
        outcome: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> AuditPage:
        """Rows newest first, filtered; ``next_cursor`` fetches the page after (None: no more)."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInput("limit", f"must be 1 to {MAX_PAGE}")
        where: list[str] = []
        params: list[object] = []
        if since is not None:
            where.append("at >= ?")
            params.append(cv.to_us("since", since))
        if until is not None:
            where.append("at < ?")
            params.append(cv.to_us("until", until))
        for column, value in (
            ("actor", actor),
            ("resource", resource),
            ("resource_id", resource_id),
            ("outcome", outcome),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(cv.text(column, value))
        if cursor is not None:
            at, row_id = _cursor(cursor)
            where.append("(at < ? OR (at = ? AND id < ?))")
            params += [at, at, row_id]
        sql = (
            f"SELECT {_COLUMNS} FROM audit_log {'WHERE ' + ' AND '.join(where) if where else ''} "
            "ORDER BY at DESC, id DESC LIMIT ?"
        )

        def read(tx: Tx) -> AuditPage:
            rows = tx.rows(sql, (*params, limit + 1))
            entries = [_entry(r) for r in rows[:limit]]
            more = len(rows) > limit
            last = rows[limit - 1] if more else None
            return AuditPage(entries, f"{int(last[1])}:{last[0]}" if last is not None else None)

        return await self._read(read)

    async def prune_audit(self, older_than: datetime) -> int:
        """Delete rows written before ``older_than``; how many went."""
        cut = cv.to_us("older_than", older_than)
        return await self._write_unaudited(lambda tx: tx.run("DELETE FROM audit_log WHERE at < ?", (cut,)))


def leadership_row(tx: Tx, holder: str, action: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    """A leadership change, in the lease's own transaction (the daemon acts, not an operator)."""
    insert_row(
        tx,
        actor=f"daemon:{holder}",
        peer="",
        action=action,
        outcome="ok",
        resource="leadership",
        resource_id="leader",
        changes=[change_entry("leadership", "leader", before, after)],
    )
