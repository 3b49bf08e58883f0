"""What every query module shares: the backend handle and the change counters."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from .audit_scope import collecting, current_scope
from .backend import Backend, Tx
from .errors import StoreError
from .migrations import REVISION_KINDS
from .transactions import TransactionCounts, run_transaction

T = TypeVar("T")

# Read the clock once per statement: ``now_us()`` twice in one row (created_at and updated_at)
# could differ by a microsecond. Use as ``INSERT … SELECT …, clock.t FROM {ONE_CLOCK}``.
ONE_CLOCK = "(SELECT now_us() AS t) AS clock"


def bump_revision(tx: Tx, kind: str) -> int:
    """Advance ``kind``'s change counter; call it *first* in a write transaction.

    On PostgreSQL the UPDATE takes the counter row's lock until COMMIT, which serialises writers
    of one kind: check-then-write sequences (a sibling name, a cycle in the tree) cannot race,
    and revisions become visible in the order they were handed out (no gaps for readers).
    """
    assert kind in REVISION_KINDS
    row = tx.one("UPDATE revisions SET value = value + 1 WHERE kind = ? RETURNING value", (kind,))
    if row is None:
        raise StoreError(f"revision counter {kind!r} is missing: the schema is damaged")
    return int(row[0])


def new_id() -> str:
    return uuid.uuid4().hex


class OpsBase:
    _backend: Backend
    transactions: TransactionCounts

    async def _write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in a write transaction; inside an admin action, with its audit row.

        This is the one door every store change goes through, so it is where the audit log is
        written (see ``audit_scope``): in the same transaction as the change, or not at all.
        """
        scope = current_scope()
        if scope is None:
            return await run_transaction(self._backend, self.transactions, fn, write=True)
        from .ops_audit import write_scope_row  # (ops_audit builds on this module)

        def audited(tx: Tx) -> tuple[T, str, list[dict[str, Any]]]:
            with collecting() as notes:
                result = fn(tx)
            if not notes:
                # An operation that says nothing of what it changed is still recorded, by name.
                name = getattr(fn, "__qualname__", "write").split(".<locals>")[0]
                notes = [{"resource": "store", "id": name, "op": "write", "before": None, "after": None}]
            row_id, changes = write_scope_row(tx, scope, notes)
            return result, row_id, changes

        result, row_id, changes = await run_transaction(self._backend, self.transactions, audited, write=True)
        # Committed: later writes of the same action update this row.
        scope.row_id, scope.changes = row_id, changes
        return result

    async def _write_unaudited(self, fn: Callable[[Tx], T]) -> T:
        """A write that is the audit log's own (its rows, its pruning): never audited itself."""
        return await run_transaction(self._backend, self.transactions, fn, write=True)

    async def _read(self, fn: Callable[[Tx], T]) -> T:
        return await run_transaction(self._backend, self.transactions, fn, write=False)
