"""Choosing a replica: pure functions over plain values, so every rule is testable without I/O."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar


class Candidate(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def weight(self) -> float: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def cooldown_until(self) -> float: ...


C = TypeVar("C", bound=Candidate)


def choose(
    candidates: Sequence[C], *, now: float, exclude: Collection[str] = (), rng: random.Random | None = None
) -> C | None:
    """A replica with a free slot, or None when every slot is busy (or every replica excluded).

    Least loaded relative to its slots, scaled by its weight: ``(in_flight + 1) / (slots *
    weight)``, so a replica with twice the slots (or twice the weight) takes twice the requests.
    A replica whose slots are all busy is never chosen: the request waits for a slot in the
    gateway's queue, where priorities and the scale-out signal can see it, rather than in the
    engine's, where neither can. Replicas cooling down are chosen only when no other has a free
    slot: a cooldown is advice, not a verdict, and when every replica failed recently trying
    the one whose cooldown ends first beats refusing. Ties are broken at random so that a burst
    does not pile onto the first replica in the list.

    One pass, no lists: this runs for every request.
    """
    best: C | None = None
    best_score = float("inf")
    ties = 0
    cooling: C | None = None
    for c in candidates:
        if c.in_flight >= c.slots or (exclude and c.id in exclude):
            continue
        if c.cooldown_until > now:
            if cooling is None or c.cooldown_until < cooling.cooldown_until:
                cooling = c
            continue
        score = (c.in_flight + 1) / (c.slots * c.weight)
        if score < best_score:
            best, best_score, ties = c, score, 1
        elif score == best_score:
            # Reservoir sampling: each of k tied replicas ends up chosen with probability 1/k.
            ties += 1
            if (rng or random).random() * ties < 1:
                best = c
    return best if best is not None else cooling
