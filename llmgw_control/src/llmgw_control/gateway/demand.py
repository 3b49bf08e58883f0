"""Demand: how many requests wait per profile key, with one owner.

The activator's queues are the only source (``queued``, its call alone); the reconciler reads
them as the demand for replicas and the live window as the models' queue depths (``waiting``,
``snapshot``). Built first (app.py) and handed to all three in their constructors, so none of
them holds another's dict or is wired after it is built.
"""

from __future__ import annotations

from collections.abc import Mapping


class WaitingRequests:
    __slots__ = ("_counts",)

    def __init__(self) -> None:
        # Only keys with a request waiting: an idle model costs no entry.
        self._counts: dict[str, int] = {}

    def waiting(self, profile_key: str) -> int:
        """Requests waiting for ``profile_key`` now (0 for a key nobody asked for)."""
        return self._counts.get(profile_key, 0)

    def snapshot(self) -> Mapping[str, int]:
        """Every key with requests waiting, and how many: a copy, safe to hold across a checkpoint."""
        return dict(self._counts)

    def queued(self, profile_key: str, count: int) -> None:
        """``profile_key``'s queue holds ``count`` requests now (the activator's call: its queues are the count)."""
        if count > 0:
            self._counts[profile_key] = count
        else:
            self._counts.pop(profile_key, None)
