"""A replica's status, and the transitions between statuses that can happen: one table, both daemons.

The node reports its replicas in the wire's words (``pending`` ... ``failed``, the values of
``wire.WireReplicaStatus``); control adds one of its own, ``assigned``: the ``StartReplica`` is sent and
the node has not reported the replica yet. Control sees snapshots (a heartbeat carries only the
latest state, a restarted node re-adopts its engines from ``pending``), so the table allows every
jump a node can legitimately make, and forbids what cannot happen: leaving a terminal status,
returning to ``assigned``, fetching weights again once the engine has started, or a draining
engine becoming anything but gone.

Three different things propose a transition, and they are treated differently:

* **control itself** (a start sent, a drain, a deadline passed): ``REPLICA_LIFECYCLE.move``
  raises ``ImpossibleTransition``, because only a bug in control can ask for one;
* **a node's report**, in control: ``allowed`` says whether to apply it. A report that breaks the
  table is hostile or confused input from the network, logged and ignored, never an exception;
* **the node's supervisor**, before it records and reports a change: a transition the table
  forbids is a bug in the node; it is logged as an error and refused (the replica keeps its status
  and nothing is sent), because a node daemon must not die for one replica's bookkeeping.
"""

from __future__ import annotations

from enum import StrEnum
from typing import cast

from llmgw_shared.transitions import Lifecycle
from llmgw_shared.wire import WireReplicaStatus


class ReplicaStatus(StrEnum):
    ASSIGNED = "assigned"
    PENDING = "pending"
    DOWNLOADING = "downloading"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


_ENDS = {ReplicaStatus.DRAINING, ReplicaStatus.STOPPED, ReplicaStatus.FAILED}
REPLICA_LIFECYCLE = Lifecycle(
    "replica",
    ReplicaStatus,
    start={ReplicaStatus.ASSIGNED},
    transitions={
        # A start is answered by whatever the node reached by its next report.
        ReplicaStatus.ASSIGNED: {
            ReplicaStatus.PENDING,
            ReplicaStatus.DOWNLOADING,
            ReplicaStatus.STARTING,
            ReplicaStatus.READY,
            *_ENDS,
        },
        ReplicaStatus.PENDING: {ReplicaStatus.DOWNLOADING, ReplicaStatus.STARTING, ReplicaStatus.READY, *_ENDS},
        ReplicaStatus.DOWNLOADING: {ReplicaStatus.STARTING, ReplicaStatus.READY, *_ENDS},
        # PENDING again: the node daemon restarted and is adopting the running engine (it checks its
        # health before reporting it ready again).
        ReplicaStatus.STARTING: {ReplicaStatus.PENDING, ReplicaStatus.READY, *_ENDS},
        # STARTING again: the engine crashed and the node restarts it (with backoff).
        ReplicaStatus.READY: {ReplicaStatus.PENDING, ReplicaStatus.STARTING, *_ENDS},
        ReplicaStatus.DRAINING: {ReplicaStatus.STOPPED, ReplicaStatus.FAILED},
        ReplicaStatus.STOPPED: set(),
        ReplicaStatus.FAILED: set(),
    },
)

TERMINAL = REPLICA_LIFECYCLE.terminal
# Holding a claim on the node's memory: everything but the terminal statuses.
HOLDING = frozenset(ReplicaStatus) - TERMINAL
# Where a replica starts on its node: a started one waits for its engine and weights, and an
# adopted one is health-checked before it is reported ready again.
NODE_START = ReplicaStatus.PENDING


def allowed(current: ReplicaStatus, new: ReplicaStatus) -> bool:
    """Whether a replica may go from ``current`` to ``new`` (staying put is allowed unless terminal)."""
    return REPLICA_LIFECYCLE.allowed(current, new)


def on_wire(status: ReplicaStatus) -> WireReplicaStatus:
    """The wire's spelling of a status a node reports (``assigned`` is control's own: never sent)."""
    if status == ReplicaStatus.ASSIGNED:
        raise ValueError("a node never reports a replica as assigned")
    return cast(WireReplicaStatus, status.value)
