"""A replica as the balancer and the affinity choice see it (``balancer.Candidate``), for pure tests."""

from __future__ import annotations

import attrs


@attrs.define
class FakeCandidate:
    """The five fields a choice reads; the load and cooldown are set by each test."""

    id: str
    in_flight: int = 0
    slots: int = 1000
    weight: float = 1.0
    cooldown_until: float = 0.0
