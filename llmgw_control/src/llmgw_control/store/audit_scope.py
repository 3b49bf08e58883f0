"""Who is changing the store right now, and what each write changed: the audit log's capture.

Every admin change reaches the database through ``OpsBase._write`` (one write transaction per
store call). While an ``AuditScope`` is open in the calling task (the admin API opens one around
each state-changing request, see ``admin/audit_log.py``), ``_write`` runs the operation and then,
in the same transaction, writes or updates that request's one audit row. So a change and its
record commit together or not at all, and no admin path can change the store without a row:
the capture sits below every route, service and worker, at the one place they all pass.

Operations describe what they changed with ``note_change`` (resource, id, the fields before and
after); a write that notes nothing is still recorded, under its operation's name. ``note_change``
runs in the backend's worker thread, inside the transaction, so the notes travel in a
thread-local, set only for the length of one audited transaction.

Secrets never reach a row: fields whose name says secret (``SECRET_FIELD``) keep only the fact
that they changed, and the store never holds a key's secret to begin with (only its digest,
which is also withheld).
"""

from __future__ import annotations

import contextvars
import enum
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import attrs

# Field names whose values are never recorded: secrets, and digests of secrets (a digest of a
# low-entropy secret can be brute-forced). Matched anywhere in the name, case-insensitively.
# "token" as a word (join_token, hf_token, token_digest), not "tokens_per_minute".
SECRET_FIELD = re.compile(
    r"secret|passw|digest|api_?key|authori[sz]ation|credential|private|cookie|signature|bearer"
    r"|(^|[_\-. ])token($|[_\-. ])",
    re.IGNORECASE,
)
REDACTED = "[redacted]"
# Bounds on one recorded value, so a large model document cannot make a huge audit row: a string
# over 2 KiB is cut, a structure deeper than 8 is summarised, a row keeps at most 50 changes.
MAX_TEXT = 2048
MAX_DEPTH = 8
MAX_CHANGES = 50


@attrs.define
class AuditScope:
    """One admin action in progress: who, from where, what; and its row once written."""

    actor: str
    peer: str
    action: str
    resource: str
    resource_id: str
    row_id: str | None = None
    changes: list[dict[str, Any]] = attrs.Factory(list)
    # Closed when the request ends: a task the request spawned (a pull, a capacity run) inherits
    # the scope but its later writes are the daemon's own, not this operator's action.
    open: bool = True


CURRENT: contextvars.ContextVar[AuditScope | None] = contextvars.ContextVar("llmgw_audit_scope", default=None)


def current_scope() -> AuditScope | None:
    scope = CURRENT.get()
    return scope if scope is not None and scope.open else None


@contextmanager
def audit_scope(scope: AuditScope) -> Iterator[AuditScope]:
    token = CURRENT.set(scope)
    try:
        yield scope
    finally:
        scope.open = False
        CURRENT.reset(token)


_notes = threading.local()


@contextmanager
def collecting() -> Iterator[list[dict[str, Any]]]:
    """Collect ``note_change`` calls made in this thread (inside one transaction)."""
    notes: list[dict[str, Any]] = []
    _notes.current = notes
    try:
        yield notes
    finally:
        _notes.current = None


def note_change(
    resource: str, resource_id: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> None:
    """Record, for the audit row of the action in progress, what one write changed.

    ``before`` None: created; ``after`` None: deleted. Only fields that differ are kept, and
    secret-named fields are redacted. Outside an audited transaction this does nothing.
    """
    notes: list[dict[str, Any]] | None = getattr(_notes, "current", None)
    if notes is None:
        return
    notes.append(change_entry(resource, resource_id, before, after))


def change_entry(
    resource: str, resource_id: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> dict[str, Any]:
    old = {k: scrub_value(k, v) for k, v in (before or {}).items()}
    new = {k: scrub_value(k, v) for k, v in (after or {}).items()}
    if before is not None and after is not None:
        changed = sorted(
            k
            for k in old.keys() | new.keys()
            if old.get(k) != new.get(k) or (SECRET_FIELD.search(k) and (before.get(k) != after.get(k)))
        )
        old = {k: old[k] for k in changed if k in old}
        new = {k: new[k] for k in changed if k in new}
    op = "create" if before is None else "delete" if after is None else "update"
    return {
        "resource": resource,
        "id": resource_id,
        "op": op,
        "before": old if before is not None else None,
        "after": new if after is not None else None,
    }


def scrub_value(name: str, value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-ready data, with secret-named fields (at any depth) redacted."""
    if SECRET_FIELD.search(name):
        return None if value is None else REDACTED
    if depth >= MAX_DEPTH:
        return "[too deep]"
    if isinstance(value, Mapping):
        return {str(k): scrub_value(str(k), v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [scrub_value("", v, depth + 1) for v in items]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + "…"
    if value is None or isinstance(value, bool | int | float):
        return value
    if attrs.has(type(value)):
        return scrub_value(name, attrs.asdict(value, recurse=False), depth)
    return str(value)[:MAX_TEXT]


def record_fields(record: Any, *, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """An attrs record's fields for ``note_change``, less bookkeeping ones (``leave_out``)."""
    return {k: v for k, v in attrs.asdict(record, recurse=False).items() if k not in leave_out}
