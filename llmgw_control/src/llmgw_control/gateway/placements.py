"""Where this daemon last sent each affinity id: the replica holding that conversation's cache.

Rendezvous hashing alone places an affinity id on the replica its hash prefers, loaded or not, and the
load bound lets the preferred replica run ahead of the others (three requests against one at
four in flight on two replicas). For an id seen for the first time that is a pure cost: no
replica holds anything of its conversation yet (the shared system prompt is on every replica
that has served one), so the preference buys nothing and the imbalance costs throughput
(measured: 5.4% fewer unique prompts per second than least-loaded, docs/performance.md,
the figures the code cites). So a new conversation goes to the least loaded replica and is
remembered here; its later turns go back to where it went (within the load bound), which is
where its cache is.

The memory is this daemon's own. Several daemons serving one fleet do not share it: a daemon
that never saw a conversation's earlier turns routes them by the id's rendezvous order, which
every daemon agrees on, and remembers that (gateway/affinity.py, ``pick``). A conversation whose
turns alternate between daemons after one of them placed its first turn by load goes to each
daemon's remembered replica in turn (docs/operator-guide.md says what to do about it); sharing
the memory would put a store round trip on every request.

Bounded, least recently used first out: each entry is a 16-byte affinity id and a replica id (~200
bytes with Python's overhead), so the bound is a few MiB. A replica keeps a conversation's
cache in one of its engine slots or its host-memory prompt cache, a few dozen conversations at
most; a conversation not touched in the last ``PLACEMENTS`` placements has lost its cache
everywhere, and forgetting it costs nothing.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["PLACEMENTS", "Placements"]

# 65,536 conversations: a thousand times what a replica's slots and prompt cache hold, so an
# entry is evicted long after its cache; and ~13 MiB at the worst, which no flood of new ids can
# exceed.
PLACEMENTS = 65_536


class Placements:
    """(Model, affinity id) → the replica id this daemon last placed it on; least recently used out first.

    Per model: one ``user`` talking to two models is two conversations, on two sets of replicas,
    and one entry for both would make each request look new to the other model.
    """

    __slots__ = ("_capacity", "_where")

    def __init__(self, capacity: int = PLACEMENTS) -> None:
        if capacity < 1:
            raise ValueError("a placement memory holds at least one affinity id")
        self._capacity = capacity
        self._where: OrderedDict[tuple[str, bytes], str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._where)

    def get(self, model: str, affinity_id: bytes) -> str | None:
        """The replica of ``model`` that ``affinity_id`` was last placed on, or None when this daemon
        has not placed it."""
        return self._where.get((model, affinity_id))

    def record(self, model: str, affinity_id: bytes, replica_id: str) -> None:
        """``affinity_id`` now runs on ``replica_id``: its cache is there, so its next turn should be too."""
        where = self._where
        entry = (model, affinity_id)
        where[entry] = replica_id
        where.move_to_end(entry)
        if len(where) > self._capacity:
            where.popitem(last=False)
