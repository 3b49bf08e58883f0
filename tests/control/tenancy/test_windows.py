"""The counting windows on their own: strict sliding minute, per-second buckets, UTC day."""

from __future__ import annotations

from llmgw_control.tenancy import DayCounter, SlidingWindow

T0 = 1_000_000.0  # a whole second, for readable arithmetic


def test_sliding_window_counts_for_at_least_a_minute() -> None:
    w = SlidingWindow()
    w.add(T0 + 0.9, 5)
    assert w.total(T0 + 0.9) == 5
    # Still counted 60 s after it was added, whatever the fraction of the second...
    assert w.total(T0 + 60.9) == 5
    assert w.total(T0 + 60.999) == 5
    # ...and gone once its bucket is more than 60 whole seconds old.
    assert w.total(T0 + 61.0) == 0


def test_sliding_window_rolls_over_bucket_by_bucket() -> None:
    w = SlidingWindow()
    for i in range(10):
        w.add(T0 + i * 10, 1)  # one every 10 s
    assert w.total(T0 + 90) == 7  # the ones at 30..90 (and 30 is 60 s old: still counted)
    assert w.total(T0 + 91) == 6
    assert w.total(T0 + 200) == 0


def test_remove_gives_back_only_what_is_still_in_the_window() -> None:
    w = SlidingWindow()
    second = w.add(T0, 3)
    w.add(T0 + 5, 2)
    w.remove(second, 1)
    assert w.total(T0 + 5) == 4
    w.remove(second, 10)  # never more than the bucket holds
    assert w.total(T0 + 5) == 2
    old = w.add(T0 + 6, 1)
    assert w.total(T0 + 100) == 0
    w.remove(old, 1)  # long gone: nothing happens, nothing goes negative
    assert w.total(T0 + 100) == 0


def test_seconds_until_freed() -> None:
    w = SlidingWindow()
    w.add(T0, 4)
    w.add(T0 + 30, 6)
    assert w.seconds_until_freed(T0 + 40, 3) == 21  # the bucket at T0 leaves at T0 + 61
    assert w.seconds_until_freed(T0 + 40, 5) == 51  # needs the T0 + 30 bucket too
    assert w.seconds_until_freed(T0 + 40, 11) is None


def test_clock_stepping_back_keeps_counting() -> None:
    w = SlidingWindow()
    w.add(T0 + 10, 1)
    second = w.add(T0 + 5, 1)  # went into the newest bucket
    assert second == int(T0 + 10)
    assert w.total(T0 + 10) == 2
    w.remove(second, 1)
    assert w.total(T0 + 10) == 1


def test_day_counter_resets_at_utc_midnight_only_forwards() -> None:
    day = DayCounter()
    midnight = 86_400.0 * 20_000
    day.add(midnight - 10, 100)
    assert day.total(midnight - 1) == 100
    assert DayCounter.seconds_until_reset(midnight - 10) == 10
    assert day.total(midnight) == 0
    day.add(midnight + 1, 7)
    # A clock that steps back over midnight does not wipe (or restore) anything.
    assert day.total(midnight - 5) == 7


def test_sliding_window_matches_a_naive_model() -> None:
    """Random adds, removes and time steps (some backwards) against a plain list of events."""
    import random

    rng = random.Random(1)
    w = SlidingWindow()
    events: list[list[int]] = []  # [bucket second, amount]: what the window should hold
    now = T0
    for _ in range(5000):
        now = max(T0, now + rng.choice([0.0, 0.3, 1.7, 7.0, 25.0, 61.0, -2.0]))
        action = rng.random()
        if action < 0.5:
            amount = rng.randint(0, 50)
            second = w.add(now, amount)
            # The model: a new bucket unless the newest is this second or later.
            newest = max((e[0] for e in events), default=None)
            assert second == (int(now) if newest is None or newest < int(now) else newest)
            events.append([second, amount])
        elif action < 0.7 and events:
            event = rng.choice(events)
            taken = rng.randint(0, 60)
            before = w.total(now)
            w.remove(event[0], taken)
            in_window = [e for e in events if e[0] == event[0] and e[0] >= int(now) - 60]
            expected = min(taken, sum(e[1] for e in in_window)) if in_window else 0
            assert before - w.total(now) == expected
            for e in in_window:
                use = min(e[1], expected)
                e[1] -= use
                expected -= use
        expected_total = sum(a for s, a in events if s >= int(now) - 60)
        assert w.total(now) == expected_total
        events = [e for e in events if e[0] >= int(now) - 60]
