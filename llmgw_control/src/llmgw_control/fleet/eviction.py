"""Which idle replicas to evict so a model that fits on no node gets room: part of the pure plan.

The rules, each for a reason:

* never a replica with requests in flight or queued for its model (it is serving) -- unless the
  model waiting for room has had requests queued longer than ``yield_after`` (``starved``): then a
  busy assignment yields too, or a steady stream for it would starve the other model for ever;
* never below a profile's ``min_replicas`` (the operator asked for them to stay);
* never one started less than ``evict_min_age`` ago: two models that do not fit together would
  otherwise swap on every pass, each load paid for and none served;
* only ready replicas: one still starting has not served what it was started for;
* least recently used first, and the smallest set that frees enough: on each node the least
  recently used candidates are taken until the room suffices, then any the room does not need
  after all is put back (most recently used first); among nodes, the one needing fewest evictions,
  then the one wasting least memory.

Memory already on its way out (replicas draining on the node) counts first: while what drains
is enough, nothing more is evicted and the model waits for it to stop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from ..catalog import Claim
from .lifecycle import TERMINAL, ReplicaStatus

if TYPE_CHECKING:  # plan imports this module; the types only are needed here
    from .plan import Assignment


@attrs.frozen
class Room:
    node_id: str
    # To drain now, least recently used first.
    evict: tuple[Assignment, ...]
    # Replicas already draining there whose memory the room counts on.
    draining: tuple[Assignment, ...]
    # Memory freed beyond the need (the tie-break between nodes).
    waste_mib: int


def make_room(
    for_profile_key: str,
    claims: dict[str, Claim],
    free_ram: dict[str, int],
    free_vram: dict[str, int],
    assignments: dict[str, list[Assignment]],
    live_count: dict[str, int],
    min_replicas: dict[str, int],
    *,
    starved: bool,
    now: float,
    min_age: float,
) -> Room | None:
    """The best room for one replica of ``for_profile_key`` among the nodes of ``claims`` (node -> the claim
    there), or None when evicting what may be evicted frees enough on none of them."""
    best: Room | None = None
    for node_id in sorted(claims):
        room = _room_on(
            node_id,
            for_profile_key,
            claims[node_id],
            free_ram[node_id],
            free_vram[node_id],
            assignments.get(node_id, []),
            live_count,
            min_replicas,
            starved=starved,
            now=now,
            min_age=min_age,
        )
        if room is not None and (best is None or (len(room.evict), room.waste_mib) < (len(best.evict), best.waste_mib)):
            best = room
    return best


def may_evict(assignment: Assignment, for_profile_key: str, *, starved: bool, now: float, min_age: float) -> bool:
    """Whether ``assignment`` may be evicted for ``for_profile_key`` at all (``min_replicas`` aside)."""
    return (
        assignment.profile_key != for_profile_key
        and not assignment.draining
        and assignment.status == ReplicaStatus.READY
        and (starved or not assignment.busy)
        and now - assignment.started_at >= min_age
    )


def _room_on(
    node_id: str,
    for_profile_key: str,
    claim: Claim,
    free_ram: int,
    free_vram: int,
    assignments: list[Assignment],
    live_count: dict[str, int],
    min_replicas: dict[str, int],
    *,
    starved: bool,
    now: float,
    min_age: float,
) -> Room | None:
    draining = tuple(r for r in assignments if r.draining and r.status not in TERMINAL)
    short_ram = claim.ram_mib - free_ram - sum(r.holding.ram_mib for r in draining)
    short_vram = claim.vram_mib - free_vram - sum(r.holding.vram_mib for r in draining)
    if short_ram <= 0 and short_vram <= 0:
        # Enough in total once what drains has stopped; with nothing draining, the totals fit
        # and it is the node's GPUs one by one that do not: evicting by totals cannot help.
        return Room(node_id, (), draining, -max(short_ram, short_vram)) if draining else None
    candidates = sorted(
        (r for r in assignments if may_evict(r, for_profile_key, starved=starved, now=now, min_age=min_age)),
        key=lambda r: (r.last_used, r.replica_id),
    )
    chosen: list[Assignment] = []
    taken: dict[str, int] = {}
    for assignment in candidates:
        if _covers(chosen, short_ram, short_vram):
            break
        profile_key = assignment.profile_key
        if live_count.get(profile_key, 0) - taken.get(profile_key, 0) <= min_replicas.get(profile_key, 0):
            continue
        taken[profile_key] = taken.get(profile_key, 0) + 1
        chosen.append(assignment)
    if not _covers(chosen, short_ram, short_vram):
        return None
    # Put back what the room does not need, most recently used first: the smallest set.
    for assignment in reversed(list(chosen)):
        rest = [r for r in chosen if r is not assignment]
        if _covers(rest, short_ram, short_vram):
            chosen = rest
    freed_ram, freed_vram = _freed(chosen)
    return Room(node_id, tuple(chosen), draining, (freed_ram - max(short_ram, 0)) + (freed_vram - max(short_vram, 0)))


def _freed(assignments: Iterable[Assignment]) -> tuple[int, int]:
    ram = vram = 0
    for assignment in assignments:
        ram += assignment.holding.ram_mib
        vram += assignment.holding.vram_mib
    return ram, vram


def _covers(chosen: list[Assignment], short_ram: int, short_vram: int) -> bool:
    ram, vram = _freed(chosen)
    return ram >= short_ram and vram >= short_vram
