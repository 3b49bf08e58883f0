"""Keeping a conversation on one engine slot of its replica (llama-server's ``id_slot``).

Routing a conversation to its replica is only half of keeping its cache: llama-server b11312
keeps a conversation's history in the KV cache of the slot that served it, and when a request
lands on a slot that holds *another* conversation sharing its system prompt, the engine keeps
that shared prefix and computes the whole history again. Its host-memory prompt cache
(``--cache-ram``) holds the history too, but b11312 consults it only when the slot it chose would
keep less than half of its context (``get_available_slot``: ``f_keep < 0.5``), which a shared
system prompt of several hundred tokens never allows. Measured directly on one replica with
``-np 4`` and three conversations taking turns (docs/performance.md, the figures the code cites): turn
four reused 673 of 848 prompt tokens without a slot named, 819 of 848 with each conversation's
own slot.

So a request with an affinity id that goes to a llama-server replica names a slot, and the slot
is *the one that holds its conversation*: each slot remembers the id that used it last. An id
takes its own slot back when it is free; an id without one takes the free slot used least
recently (an unused one first), whose conversation has waited longest and is the likeliest to be
over. An earlier version chose by rendezvous hashing over the free slots: stable for one id, but
two conversations whose hashes picked the same slot took it from each other on every turn (four
conversations on four slots collide with probability 91%), and the bench with think time between
turns showed prefix routing recomputing as much history as least-loaded (docs/performance.md,
the figures the code cites).

Naming a slot another request is using would make llama-server hold the request until that slot
is free while others sit idle; so a conversation whose slot is taken gets another (it loses its
cache once, never waits for it). When every engine slot is held (the gateway's slot bound above
the engine's ``-np``), the request names none and the engine chooses.

A slot is claimed for one attempt and given back when the attempt ends, however it ends (the
caller's ``finally``). Only this daemon's requests are counted: another daemon serving the same
replica from the leader's view does not pin (its view carries no engine slots), and a request the
engine places itself may occupy a slot claimed next, which then waits for one request at most.
"""

from __future__ import annotations

from .replicas import Replica

__all__ = ["claim_engine_slot", "give_back_engine_slot"]


def claim_engine_slot(replica: Replica, affinity_id: bytes) -> int | None:
    """The engine slot ``affinity_id`` should use on ``replica``, now held; None to let the engine choose.

    Its own slot (the one it used last) when that is free, else the free slot used least
    recently; the slot then belongs to ``affinity_id`` and becomes the most recently used.
    """
    if replica.engine_slots <= 0:
        return None
    owners = replica.engine_slot_owners
    held = replica.held_engine_slots
    chosen: int | None = None
    # One pass over at most _MAX_ENGINE_SLOTS entries, in least-recently-used order.
    for slot, owner in owners.items():
        if slot in held:
            continue
        if owner == affinity_id:
            chosen = slot
            break
        if chosen is None:
            chosen = slot
    if chosen is None:
        return None
    # Re-inserting moves the slot to the end: the most recently used.
    del owners[chosen]
    owners[chosen] = affinity_id
    held.add(chosen)
    return chosen


def give_back_engine_slot(replica: Replica, slot: int | None) -> None:
    """Give ``slot`` back (None: nothing was claimed)."""
    if slot is not None:
        replica.held_engine_slots.discard(slot)
