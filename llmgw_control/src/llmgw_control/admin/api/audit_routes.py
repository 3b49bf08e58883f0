"""``GET /api/v1/audit``: the audit log, newest first, filtered and paged (see ``admin/audit_log.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs

from ...api_errors import AdminApiError, bad_request
from ...store.ops_audit import MAX_PAGE
from .core import Api, Call, Param

if TYPE_CHECKING:
    from ...store import AuditEntry, Store


@attrs.frozen
class AuditChangeView:
    resource: str
    id: str
    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@attrs.frozen
class AuditView:
    id: str
    at: datetime
    actor: str
    peer: str
    action: str
    outcome: str
    resource: str
    resource_id: str
    changes: list[AuditChangeView]


@attrs.frozen
class AuditList:
    entries: list[AuditView]
    next_cursor: str | None = None


def audit_view(entry: AuditEntry) -> AuditView:
    changes = [
        AuditChangeView(
            str(c.get("resource", "")), str(c.get("id", "")), str(c.get("op", "")), c.get("before"), c.get("after")
        )
        for c in entry.changes
    ]
    return AuditView(
        entry.id,
        entry.at,
        entry.actor,
        entry.peer,
        entry.action,
        entry.outcome,
        entry.resource,
        entry.resource_id,
        changes,
    )


def add_audit_routes(api: Api, store: Store | None) -> None:
    @api.route(
        "GET",
        "/audit",
        summary="The audit log: admin changes and refusals, newest first",
        tag="audit",
        response=AuditList,
        errors=(503,),
        query=(
            Param("since", "date-time", doc="From this time on"),
            Param("until", "date-time", doc="Before this time (exclusive)"),
            Param("actor", doc="key:<id>, user:<name>, loopback or daemon:<id>"),
            Param("resource", doc="key, group, quota, model, node, pull, capacity_run, leadership, admin..."),
            Param("resource_id"),
            Param("outcome", doc="ok or refused"),
            Param("cursor", doc="next_cursor of the previous page"),
            Param("limit", "integer", doc=f"Rows per page, 1 to {MAX_PAGE} (default 100)"),
        ),
    )
    async def audit(call: Call) -> AuditList:
        if store is None:
            raise AdminApiError(503, "not_ready", "the store is not available on this daemon")
        q = call.query
        limit = q.get("limit", 100)
        if not 1 <= limit <= MAX_PAGE:
            raise bad_request("limit", f"must be 1 to {MAX_PAGE}")
        if q.get("outcome") not in (None, "ok", "refused"):
            raise bad_request("outcome", "must be ok or refused")
        page = await store.list_audit(
            since=q.get("since"),
            until=q.get("until"),
            actor=q.get("actor"),
            resource=q.get("resource"),
            resource_id=q.get("resource_id"),
            outcome=q.get("outcome"),
            cursor=q.get("cursor"),
            limit=limit,
        )
        return AuditList([audit_view(e) for e in page.entries], page.next_cursor)
