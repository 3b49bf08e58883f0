"""Counting windows for quotas: a sliding minute in one-second buckets and a fixed UTC day.

Both take ``now`` as Unix seconds from the caller's clock (injected, so tests move time by
hand). Neither does I/O; every method is a few dictionary/deque operations.

The minute window is *strict*: an amount added at time ``t`` is counted until the start of the
second ``floor(t) + 61``, i.e. for 60 to 61 seconds. Counting slightly longer than a minute is
what makes the guarantee exact: in **every** 60-second interval, whatever its start, the amounts
added never exceed what the window admitted against. (A window counting *less* than 60 s would
let a client squeeze in extra at the edges.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

Clock = Callable[[], float]

MINUTE = 60
DAY = 86_400


class SlidingWindow:
    """Amounts added in the last minute (``span`` seconds), kept in per-second buckets."""

    __slots__ = ("_buckets", "_total", "span")

    def __init__(self, span: int = MINUTE) -> None:
        self.span = span
        # [second, amount], oldest first; at most span + 1 buckets survive _expire.
        self._buckets: deque[list[int]] = deque()
        self._total = 0

    def _expire(self, second: int) -> None:
        horizon = second - self.span
        buckets = self._buckets
        while buckets and buckets[0][0] < horizon:
            self._total -= buckets.popleft()[1]

    def total(self, now: float) -> int:
        self._expire(int(now))
        return self._total

    def add(self, now: float, amount: int) -> int:
        """Count ``amount`` at ``now``; returns the bucket (second) it went into, for ``remove``."""
        second = int(now)
        self._expire(second)
        buckets = self._buckets
        if buckets and buckets[-1][0] >= second:
            # Same second, or the clock stepped back: the newest bucket keeps the deque ordered
            # and counts the amount for at least as long as its own second would have.
            buckets[-1][1] += amount
            second = buckets[-1][0]
        else:
            buckets.append([second, amount])
        self._total += amount
        return second

    def remove(self, second: int, amount: int) -> None:
        """Take back ``amount`` added into bucket ``second``; nothing if it has left the window."""
        for bucket in reversed(self._buckets):
            if bucket[0] == second:
                taken = min(amount, bucket[1])
                bucket[1] -= taken
                self._total -= taken
                return
            if bucket[0] < second:
                return

    def seconds_until_freed(self, now: float, amount: int) -> float | None:
        """How long until at least ``amount`` has left the window; None if it never will
        (the window holds less than that)."""
        self._expire(int(now))
        freed = 0
        for second, value in self._buckets:
            freed += value
            if freed >= amount:
                return max(0.0, second + self.span + 1 - now)
        return None


class DayCounter:
    """Amounts added since the start of the current UTC day (a fixed window, reset at midnight)."""

    __slots__ = ("_amount", "_day")

    def __init__(self) -> None:
        self._day = -1
        self._amount = 0

    def _roll(self, now: float) -> None:
        day = int(now // DAY)
        # Only forward: a clock stepping back over midnight must not wipe the day's count.
        if day > self._day:
            self._day = day
            self._amount = 0

    def total(self, now: float) -> int:
        self._roll(now)
        return self._amount

    def add(self, now: float, amount: int) -> None:
        self._roll(now)
        self._amount += amount

    @staticmethod
    def seconds_until_reset(now: float) -> float:
        return (int(now // DAY) + 1) * DAY - now
