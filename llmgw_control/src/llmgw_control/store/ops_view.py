"""The leader's view of ready replicas, which every standby serves from (fleet/view.py).

One row: the replicas as JSON, the lease epoch of the leader that wrote them and a revision.
A write is fenced by the lease: it is refused when the lease already has a later epoch, so a
deposed leader that has not noticed yet cannot replace its successor's view with its own.
On PostgreSQL a write also NOTIFIES the new revision (store/view_notify.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from . import convert as cv
from .backend import Tx
from .errors import InvalidInput
from .ops_base import OpsBase
from .records import PublishedReplica, PublishedReplicas
from .view_notify import VIEW_CHANNEL

# A fleet this size publishes about 100 bytes a replica: far more than any fleet llmgw runs, and
# a bound on what a damaged row can make a standby parse.
MAX_VIEW_REPLICAS = 20_000


def _replica(raw: object) -> PublishedReplica | None:
    """One stored entry, or None when it is not one (skipped: one bad entry must not hide the rest)."""
    if not isinstance(raw, dict):
        return None
    try:
        return PublishedReplica(
            id=cv.name("id", raw.get("id")),
            profile_key=cv.name("key", raw.get("key")),
            url=cv.text("url", raw.get("url")),
            slots=cv.count("slots", raw.get("slots"), minimum=1),
            served_name=cv.text("served_name", raw.get("served_name", "")),
            adapters=_adapters(raw.get("adapters", [])),
            adapter_mode=cv.text("adapter_mode", raw.get("adapter_mode", ""), max_len=16),
        )
    except InvalidInput:
        return None


# A profile's adapters are bounded by the catalog (catalog/models.py MAX_ADAPTERS); a stored list
# longer than this is damaged, not a profile.
_MAX_ADAPTERS = 64


def _adapters(raw: object) -> tuple[tuple[str, float], ...]:
    if not isinstance(raw, list) or len(raw) > _MAX_ADAPTERS:
        raise InvalidInput("adapters", f"a list of at most {_MAX_ADAPTERS} [name, scale] pairs")
    out = []
    for entry in raw:
        if not isinstance(entry, list) or len(entry) != 2:
            raise InvalidInput("adapters", "each entry is [name, scale]")
        out.append((cv.name("adapters", entry[0]), cv.number("adapters", entry[1])))
    return tuple(out)


class ViewOps(OpsBase):
    async def replica_view(self) -> PublishedReplicas | None:
        """The last view written, or None when no leader ever wrote one."""

        def read(tx: Tx) -> PublishedReplicas | None:
            row = tx.one("SELECT epoch, revision, replicas, updated_at FROM replica_view WHERE id = 1")
            if row is None or int(row[0]) == 0:
                return None
            raw = cv.load_json(row[2])
            entries = raw[:MAX_VIEW_REPLICAS] if isinstance(raw, list) else []
            replicas = tuple(r for r in map(_replica, entries) if r is not None)
            return PublishedReplicas(int(row[0]), int(row[1]), replicas, cv.from_us(int(row[3])))

        return await self._read(read)

    async def publish_view(self, epoch: int, replicas: Iterable[PublishedReplica]) -> int | None:
        """Write the view of the leader of ``epoch``; its new revision, or None (nothing written)
        when the lease or the view already belongs to a later epoch."""
        epoch = cv.count("epoch", epoch, minimum=1)
        entries = [
            {
                "id": cv.name("id", r.id),
                "key": cv.name("key", r.profile_key),
                "url": cv.text("url", r.url),
                "slots": cv.count("slots", r.slots, minimum=1),
                "served_name": cv.text("served_name", r.served_name),
                "adapters": [[cv.name("adapters", n), cv.number("adapters", v)] for n, v in r.adapters],
                "adapter_mode": r.adapter_mode,
            }
            for r in replicas
        ]
        if len(entries) > MAX_VIEW_REPLICAS:
            raise InvalidInput("replicas", f"at most {MAX_VIEW_REPLICAS} replicas")
        document = json.dumps(sorted(entries, key=lambda e: e["id"]))

        def write(tx: Tx) -> int | None:
            row = tx.one(
                "UPDATE replica_view SET epoch = ?, revision = revision + 1, replicas = ?, updated_at = now_us() "
                "WHERE id = 1 AND epoch <= ? AND (SELECT epoch FROM leader_lease WHERE id = 1) <= ? "
                "RETURNING revision",
                (epoch, document, epoch, epoch),
            )
            if row is None:
                return None
            if tx.dialect == "postgresql":
                # Same transaction: delivered at COMMIT, so a standby that hears it reads the new
                # row, and a rolled-back write notifies nobody. The revision only, never the keys.
                tx.one("SELECT pg_notify(?, ?)", (VIEW_CHANNEL, str(int(row[0]))))
            return int(row[0])

        return await self._write(write)
