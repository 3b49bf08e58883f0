"""A replica's status as control records it, and the transitions between statuses that can happen.

The node reports its shards in the wire's words (``pending`` ... ``failed``); control adds one of
its own, ``assigned``: the ``start_shard`` is sent and the node has not reported the shard yet.
Control sees snapshots (a heartbeat carries only the latest state, a restarted node re-adopts
its engines from ``pending``), so the table allows every jump a node can legitimately make, and
forbids what cannot happen: leaving a terminal status, returning to ``assigned``, fetching weights
again once the engine has started, or a draining engine becoming anything but gone. The model is
llama-swap's ``isValidTransition`` (proxy/process.go): one table, checked on every change, so an
impossible transition is a bug a test catches instead of a string nobody looks at.

Two different things can propose a transition, and they are treated differently:

* **control itself** (a start sent, a drain, a deadline passed): ``check`` raises
  ``ImpossibleTransition``, because only a bug in control can ask for one;
* **a node's report**: ``allowed`` says whether to apply it. A report that breaks the table is
  hostile or confused input from the network, logged and ignored, never an exception.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    ASSIGNED = "assigned"
    PENDING = "pending"
    DOWNLOADING = "downloading"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


TERMINAL = frozenset({Status.STOPPED, Status.FAILED})
# Holding a claim on the node's memory: everything but the terminal statuses.
HOLDING = frozenset(Status) - TERMINAL

_ENDS = {Status.DRAINING, Status.STOPPED, Status.FAILED}
_TRANSITIONS: dict[Status, frozenset[Status]] = {
    # A start is answered by whatever the node reached by its next report.
    Status.ASSIGNED: frozenset({Status.PENDING, Status.DOWNLOADING, Status.STARTING, Status.READY, *_ENDS}),
    Status.PENDING: frozenset({Status.DOWNLOADING, Status.STARTING, Status.READY, *_ENDS}),
    Status.DOWNLOADING: frozenset({Status.STARTING, Status.READY, *_ENDS}),
    # PENDING again: the node daemon restarted and is adopting the running engine (it checks its
    # health before reporting it ready again).
    Status.STARTING: frozenset({Status.PENDING, Status.READY, *_ENDS}),
    # STARTING again: the engine crashed and the node restarts it (with backoff).
    Status.READY: frozenset({Status.PENDING, Status.STARTING, *_ENDS}),
    Status.DRAINING: frozenset({Status.STOPPED, Status.FAILED}),
    Status.STOPPED: frozenset(),
    Status.FAILED: frozenset(),
}


class ImpossibleTransition(RuntimeError):
    """Control tried to move a replica along a transition the table forbids: a bug in control."""


def allowed(current: Status, new: Status) -> bool:
    """Whether a replica may go from ``current`` to ``new`` (staying put is allowed unless terminal)."""
    if current == new:
        return current not in TERMINAL
    return new in _TRANSITIONS[current]


def check(shard_id: str, current: Status, new: Status) -> Status:
    """``new`` when the transition is allowed; raises ``ImpossibleTransition`` otherwise."""
    if not allowed(current, new):
        raise ImpossibleTransition(f"replica {shard_id}: {current} -> {new} cannot happen")
    return new
