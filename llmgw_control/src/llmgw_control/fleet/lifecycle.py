"""Control's side of a replica's lifecycle: the table is ``llmgw_shared.replica_lifecycle``.

The node and control check their transitions against one table, which lives in ``shared/`` with
its reasons. What is control's own is here: ``check``, for a transition control itself makes (a
start sent, a drain, a deadline passed), which raises ``ImpossibleTransition`` because only a
bug in control can ask for one. A node's report is checked with ``allowed`` instead (reconciler):
hostile or confused input from the network is logged and ignored, never an exception.
"""

from __future__ import annotations

from llmgw_shared.replica_lifecycle import HOLDING, REPLICA_LIFECYCLE, TERMINAL, ReplicaStatus, allowed
from llmgw_shared.transitions import ImpossibleTransition

__all__ = ["HOLDING", "TERMINAL", "ImpossibleTransition", "ReplicaStatus", "allowed", "check"]


def check(replica_id: str, current: ReplicaStatus, new: ReplicaStatus) -> ReplicaStatus:
    """``new`` when the transition is allowed; raises ``ImpossibleTransition`` otherwise."""
    return REPLICA_LIFECYCLE.move(replica_id, current, new)
