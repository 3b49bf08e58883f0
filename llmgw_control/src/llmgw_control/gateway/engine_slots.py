"""Keeping a conversation on one engine slot of its replica (llama-server's ``id_slot``).

Routing a conversation to its replica is only half of keeping its cache: llama-server b11312,
left to choose a slot itself, serves conversations that interleave on one replica from whichever
slot it picks and reuses only the prefix they share (the system prompt); each turn's history is
computed again. Measured directly on one replica with ``-np 4`` and three conversations taking
turns (docs/performance.md, "4 December, morning"): turn four reused 673 of 848 prompt tokens
without a slot named, 819 of 848 with each conversation's own ``id_slot``.

So a request with an affinity key that goes to a llama-server replica names a slot: the key's
rendezvous choice among the replica's engine slots that no request of this gateway holds at the
moment. Naming a slot another request is using would make llama-server hold the request until
that slot is free while others sit idle; so a conversation whose slot is taken gets the next one
in its order (it loses its cache once, never waits for it). When every engine slot is held (the
gateway's slot bound above the engine's ``-np``), the request names none and the engine chooses.

A slot is claimed for one attempt and released when the attempt ends, however it ends (the
caller's ``finally``). Only this daemon's requests are counted: another daemon serving the same
replica from the leader's view does not pin (its view carries no engine slots), and a request the
engine places itself may occupy a slot claimed next, which then waits for one request at most.
"""

from __future__ import annotations

from .affinity import rendezvous_score
from .replicas import Replica

__all__ = ["claim_engine_slot", "release_engine_slot"]


def claim_engine_slot(replica: Replica, key: bytes) -> int | None:
    """The engine slot ``key`` should use on ``replica``, now held; None to let the engine choose."""
    if replica.engine_slots <= 0:
        return None
    held = replica.held_engine_slots
    free = [slot for slot in range(replica.engine_slots) if slot not in held]
    if not free:
        return None
    chosen = max(free, key=lambda slot: rendezvous_score(key, str(slot), 1.0))
    held.add(chosen)
    return chosen


def release_engine_slot(replica: Replica, slot: int | None) -> None:
    """Give ``slot`` back (None: nothing was claimed)."""
    if slot is not None:
        replica.held_engine_slots.discard(slot)
