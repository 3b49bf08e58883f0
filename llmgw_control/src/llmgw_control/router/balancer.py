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
    def cooldown_until(self) -> float: ...


C = TypeVar("C", bound=Candidate)


def choose(
    candidates: Sequence[C], *, now: float, exclude: Collection[str] = (), rng: random.Random | None = None
) -> C | None:
    """Least in-flight per unit of weight; replicas cooling down only when nothing else is left.

    A cooldown is advice, not a verdict: when every replica of a model failed recently, trying the
    one whose cooldown ends first beats refusing the request outright. Ties are broken at random
    so that a burst of new requests does not pile onto the first replica in the list.
    """
    usable = [c for c in candidates if c.id not in exclude]
    if not usable:
        return None
    healthy = [c for c in usable if c.cooldown_until <= now]
    if not healthy:
        return min(usable, key=lambda c: c.cooldown_until)
    best_score = min((c.in_flight + 1) / c.weight for c in healthy)
    best = [c for c in healthy if (c.in_flight + 1) / c.weight == best_score]
    if len(best) == 1:
        return best[0]
    return (rng or random).choice(best)
