"""A replica's signs of life as the relay sees them, for the hang watch (gateway/hang_watch.py).

Kept apart from the watch so that ``Replica`` can hold one without importing the watch's
dependencies; the relay's hot path touches it once per chunk (one attribute store).
"""

from __future__ import annotations

import trio


class Progress:
    """One replica's signs of life, as the relay sees them: the time of the last byte from its
    engine, and the cancel scopes that wait on it now."""

    __slots__ = ("hung_since", "last", "next_probe", "probing", "waiting")

    def __init__(self) -> None:
        # trio clock: the last byte of any answer from the engine (or its last /health answer).
        self.last = 0.0
        self.waiting: set[trio.CancelScope] = set()
        # Set while the replica is withdrawn as hung (trio clock).
        self.hung_since: float | None = None
        self.probing = False
        self.next_probe = 0.0

    def wait(self, scope: trio.CancelScope) -> None:
        """``scope`` waits on the engine from now; cancelled at once should it be hung already
        (an attempt that picked the replica just before it was withdrawn)."""
        if self.hung_since is not None:
            scope.cancel()
        if not self.waiting:
            # Idle until now: silence is counted from the first wait, not from the last answer.
            self.last = trio.current_time()
        self.waiting.add(scope)

    def answered(self, scope: trio.CancelScope) -> None:
        """The response head arrived: progress, and ``scope`` waits no longer."""
        self.last = trio.current_time()
        self.waiting.discard(scope)

    def done(self, scope: trio.CancelScope) -> None:
        self.waiting.discard(scope)

    def suspect(self, now: float, after: float) -> bool:
        return self.hung_since is None and not self.probing and bool(self.waiting) and now - self.last >= after
