"""Node identities: who may join (by join-token digest), labels, the cordon flag."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from . import convert as cv
from .audit_scope import note_change, record_fields
from .backend import Row, Tx
from .convert import UNSET, Unset
from .errors import Conflict, NotFound
from .ops_base import OpsBase, bump_revision
from .records import NodeIdentity

_COLUMNS = "id, token_digest, labels, cordoned, created_at, last_seen_at"


def _fields(node: NodeIdentity) -> dict[str, object]:
    # The join token's digest is withheld (audit_scope.SECRET_FIELD); last_seen_at is bookkeeping.
    return record_fields(node, leave_out=("last_seen_at",))


def _node(row: Row) -> NodeIdentity:
    return NodeIdentity(
        id=row[0],
        token_digest=row[1],
        labels=cv.load_json(row[2]),
        cordoned=bool(row[3]),
        created_at=cv.from_us(row[4]),
        last_seen_at=cv.opt_from_us(row[5]),
    )


class NodeOps(OpsBase):
    async def add_node(self, node_id: str, token_digest: str, labels: Mapping[str, str] | None = None) -> NodeIdentity:
        """Register a node identity; ``Conflict`` if the id is taken."""
        node_id = cv.name("node_id", node_id)
        digest = cv.name("token_digest", token_digest, max_len=512)
        labels_json = cv.labels("labels", labels or {})

        def add(tx: Tx) -> NodeIdentity:
            bump_revision(tx, "nodes")
            if tx.one("SELECT 1 FROM nodes WHERE id = ?", (node_id,)) is not None:
                raise Conflict(f"node {node_id!r} already exists", field="node_id")
            row = tx.one(
                f"INSERT INTO nodes ({_COLUMNS}) VALUES (?, ?, ?, ?, now_us(), NULL) RETURNING {_COLUMNS}",
                (node_id, digest, labels_json, False),
            )
            assert row is not None
            node = _node(row)
            note_change("node", node_id, None, _fields(node))
            return node

        return await self._write(add)

    async def update_node(
        self,
        node_id: str,
        *,
        token_digest: str | Unset = UNSET,
        labels: Mapping[str, str] | Unset = UNSET,
        cordoned: bool | Unset = UNSET,
    ) -> NodeIdentity:
        """Change what was passed (a new join-token digest, labels, the cordon flag)."""
        node_id = cv.name("node_id", node_id)
        sets: list[str] = []
        params: list[object] = []
        if not isinstance(token_digest, Unset):
            sets.append("token_digest = ?")
            params.append(cv.name("token_digest", token_digest, max_len=512))
        if not isinstance(labels, Unset):
            sets.append("labels = ?")
            params.append(cv.labels("labels", labels))
        if not isinstance(cordoned, Unset):
            sets.append("cordoned = ?")
            params.append(cv.flag("cordoned", cordoned))

        def update(tx: Tx) -> NodeIdentity:
            bump_revision(tx, "nodes")
            old = tx.one(f"SELECT {_COLUMNS} FROM nodes WHERE id = ?", (node_id,))
            if old is None:
                raise NotFound("node", node_id)
            if sets:
                row = tx.one(
                    f"UPDATE nodes SET {', '.join(sets)} WHERE id = ? RETURNING {_COLUMNS}", (*params, node_id)
                )
            else:
                row = tx.one(f"SELECT {_COLUMNS} FROM nodes WHERE id = ?", (node_id,))
            if row is None:
                raise NotFound("node", node_id)
            node = _node(row)
            note_change("node", node_id, _fields(_node(old)), _fields(node))
            return node

        return await self._write(update)

    async def touch_node(self, node_id: str, seen_at: datetime | None = None) -> None:
        """Record when the node was last seen (default: now). Call it rarely, not per heartbeat.

        Does not bump the node revision: it is bookkeeping, not a change anyone must react to.
        """
        node_id = cv.name("node_id", node_id)
        seen = cv.opt_to_us("seen_at", seen_at)

        def touch(tx: Tx) -> None:
            if seen is None:
                changed = tx.run("UPDATE nodes SET last_seen_at = now_us() WHERE id = ?", (node_id,))
            else:
                changed = tx.run("UPDATE nodes SET last_seen_at = ? WHERE id = ?", (seen, node_id))
            if changed == 0:
                raise NotFound("node", node_id)

        await self._write(touch)

    async def delete_node(self, node_id: str) -> None:
        node_id = cv.name("node_id", node_id)

        def delete(tx: Tx) -> None:
            bump_revision(tx, "nodes")
            old = tx.one(f"SELECT {_COLUMNS} FROM nodes WHERE id = ?", (node_id,))
            if old is None:
                raise NotFound("node", node_id)
            tx.run("DELETE FROM nodes WHERE id = ?", (node_id,))
            note_change("node", node_id, _fields(_node(old)), None)

        await self._write(delete)

    async def get_node(self, node_id: str) -> NodeIdentity:
        node_id = cv.name("node_id", node_id)

        def get(tx: Tx) -> NodeIdentity:
            row = tx.one(f"SELECT {_COLUMNS} FROM nodes WHERE id = ?", (node_id,))
            if row is None:
                raise NotFound("node", node_id)
            return _node(row)

        return await self._read(get)

    async def list_nodes(self) -> list[NodeIdentity]:
        def list_all(tx: Tx) -> list[NodeIdentity]:
            return [_node(r) for r in tx.rows(f"SELECT {_COLUMNS} FROM nodes ORDER BY id")]

        return await self._read(list_all)
