"""A token bucket over a clock the caller passes in: grants a burst, then a steady rate.

Used to limit how many replicas are moved off lost nodes, so that a network blip which makes
every node look lost does not restart every model at once. The bucket only counts: the caller
asks how many tokens there are, does at most that much, and spends what it did. (The first
version refilled and never spent, so the limit never limited: issue 15.)
"""

from __future__ import annotations

import attrs


@attrs.define
class TokenBucket:
    capacity: int
    per_second: float
    tokens: float = attrs.field(init=False)
    # When ``tokens`` was last brought up to date; None until the first call.
    at: float | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.tokens = float(self.capacity)

    def _refill(self, now: float) -> None:
        if self.at is not None and now > self.at:
            self.tokens = min(float(self.capacity), self.tokens + (now - self.at) * self.per_second)
        if self.at is None or now > self.at:
            self.at = now

    def available(self, now: float) -> int:
        """Whole tokens that may be spent at ``now``."""
        self._refill(now)
        return int(self.tokens)

    def spend(self, count: int, now: float) -> None:
        """Take ``count`` tokens (at most what is available: the caller asked first)."""
        if count < 0:
            raise ValueError(f"cannot spend {count} tokens")
        self._refill(now)
        if count > int(self.tokens):
            raise ValueError(f"spending {count} tokens with {int(self.tokens)} available")
        self.tokens -= count
