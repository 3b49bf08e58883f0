"""The arithmetic of quota slices, with no I/O: how much a daemon may lease, and for how long.

A *slice* is part of one group's limit of one kind, granted to one daemon (the *holder*), which
spends it in memory. The store keeps one row per grant; ``counted`` below is the sum of every
row that still counts against the limit. The rule that makes the total hold: a grant never
makes ``counted`` exceed the limit, and a row keeps counting for as long as anything spent from
it could still be inside the limit's window:

- minute limits (requests, tokens): until ``MINUTE_TAIL`` seconds after the last moment the
  holder may spend from it (its expiry, or when it is closed). The local windows count an
  amount for 60 to 61 seconds (windows.py), so any 60-second interval sees only spends whose
  rows were all still counted when the latest of them was granted: the sliding guarantee holds
  for the sum of the daemons, not only for each one.
- tokens per day: until the end of the UTC day (the day window is fixed), and a grant's expiry
  is cut at midnight so nothing spent after midnight lands on the old day.
- concurrent requests: slots, not a window: a row counts until its lease expires; renewing
  replaces it.

Slices shrink as the budget nears its end: ``max(1, free // (SHARE_DIVISOR x holders))``, or
what waiting requests need if that is more, never more than is free.
"""

from __future__ import annotations

# Kinds of limit, as in Quota and in 429 messages.
CONCURRENT = "concurrent_requests"
RPM = "requests_per_minute"
TPM = "tokens_per_minute"
TPD = "tokens_per_day"
KINDS = (RPM, TPM, TPD, CONCURRENT)

MICROS = 1_000_000
DAY = 86_400
# One second longer than the minute: the local SlidingWindow counts an amount for up to 61 s.
MINUTE_TAIL = 61
# A daemon takes at most 1/(4 x holders) of what is free: small enough that a dead daemon strands
# little and several daemons share fairly, large enough that a busy group is re-leased only every
# few dozen requests while the budget is far from its end.
SHARE_DIVISOR = 4


def slice_amount(*, limit: int, counted: int, holders: int, need: int = 0, keep: int = 0) -> int:
    """What one holder is granted now.

    ``counted``: what every other live row holds (and, for windows, this holder's closed rows).
    ``holders``: daemons with a live row for the group, this one included (at least 1).
    ``need``: what requests waiting at this holder need now. ``keep``: what the holder must keep
    whatever happens (concurrent slots in flight); it is granted even past the limit, because a
    running request cannot be taken back, and counted, so nothing more is granted until it ends.
    """
    free = max(0, limit - counted - keep)
    share = max(1, free // (SHARE_DIVISOR * max(1, holders)))
    return keep + min(free, max(need, share))


def lease_times(kind: str, now_us: int, ttl_us: int) -> tuple[int, int]:
    """(expires_at, counts_until) in microseconds for a grant of ``kind`` made at ``now_us``."""
    expires = now_us + ttl_us
    if kind == TPD:
        day_end = (now_us // (DAY * MICROS) + 1) * DAY * MICROS
        return min(expires, day_end), day_end
    if kind == CONCURRENT:
        return expires, expires
    return expires, expires + MINUTE_TAIL * MICROS


def closed_counts_until(kind: str, now_us: int, counts_until: int) -> int:
    """When a row closed at ``now_us`` stops counting (nothing more is spent from it after now)."""
    if kind == TPD:
        return counts_until
    if kind == CONCURRENT:
        return now_us
    return min(counts_until, now_us + MINUTE_TAIL * MICROS)
