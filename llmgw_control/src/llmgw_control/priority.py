"""Priority classes of requests waiting for a replica slot: a group's setting, inherited down its tree."""

from __future__ import annotations

import enum


class Priority(enum.IntEnum):
    """Lower values are served first when requests wait for a slot."""

    INTERACTIVE = 0
    BATCH = 1

    @property
    def label(self) -> str:
        return self.name.lower()


PRIORITY_NAMES = tuple(p.label for p in Priority)


def parse_priority(value: str) -> Priority:
    """``interactive`` or ``batch``; ValueError naming the choices otherwise."""
    for priority in Priority:
        if priority.label == value:
            return priority
    raise ValueError(f"{value!r} is not a priority: use one of {', '.join(PRIORITY_NAMES)}")
