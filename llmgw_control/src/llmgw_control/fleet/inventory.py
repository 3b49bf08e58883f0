"""What each node is, has and runs, as its reports said: the reconciler's view of "actual".

Kept in memory on the leader. A node's liveness is derived from when it was last heard from,
not from whether its socket is open: a hung node (stopped process, cut network) keeps its
socket open and sends nothing, and only the missing heartbeats reveal it.

Liveness is derived, never stored, so nothing moves it: its table (``NODE_LIVENESS``) is what one
event can change it to -- a message heard (a hello makes a new record, connected), the connection
closed, time passing without a word -- and tests/test_lifecycles.py drives ``Liveness.state``
through random events and checks every change it shows against the table.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum

import attrs

from llmgw_shared.facts import HostFacts
from llmgw_shared.transitions import Lifecycle
from llmgw_shared.wire import EngineState, ReplicaState, WeightsHeld


@attrs.define
class NodeRecord:
    node_id: str
    address: str
    facts: HostFacts
    engines: dict[tuple[str, str], EngineState] = attrs.Factory(dict)
    replicas: dict[str, ReplicaState] = attrs.Factory(dict)
    connected: bool = True
    last_seen: float = 0.0
    connected_since: float = 0.0
    labels: dict[str, str] = attrs.Factory(dict)
    cordoned: bool = False
    # ``replicas`` came from a hello, a complete list, and the reconciler has not yet compared it
    # with what it placed there (a record the list lacks is gone). Heartbeats and
    # ReplicaStateReports only add to ``replicas``: they carry what changed.
    full_report_pending: bool = True
    # Its weights cache as it last reported it (None: not reported; a node from before reports).
    weights: list[WeightsHeld] | None = None

    def engine(self, name: str, version: str) -> EngineState | None:
        return self.engines.get((name, version))

    def update_engines(self, states: list[EngineState]) -> None:
        for state in states:
            self.engines[(state.name, state.version)] = state

    def update_replicas(self, states: list[ReplicaState]) -> None:
        for state in states:
            self.replicas[state.replica_id] = state


class NodeLiveness(StrEnum):
    READY = "ready"
    # The connection closed; heard from recently enough that it may be back at once.
    DISCONNECTED = "disconnected"
    UNREACHABLE = "unreachable"
    LOST = "lost"


_SILENCE = {NodeLiveness.UNREACHABLE, NodeLiveness.LOST}
NODE_LIVENESS = Lifecycle(
    "node",
    NodeLiveness,
    start={NodeLiveness.READY},
    transitions={
        # Closed, or silent long enough (one look may come after both thresholds have passed).
        NodeLiveness.READY: {NodeLiveness.DISCONNECTED, *_SILENCE},
        # Back (a hello), or still away.
        NodeLiveness.DISCONNECTED: {NodeLiveness.READY, *_SILENCE},
        # A silent node stays silent until it is heard again: only more time or a message moves it,
        # and a message makes it ready (a close alone changes nothing while the silence lasts).
        NodeLiveness.UNREACHABLE: {NodeLiveness.READY, NodeLiveness.LOST},
        NodeLiveness.LOST: {NodeLiveness.READY},
    },
)


@attrs.frozen
class Liveness:
    unreachable_after: float
    lost_after: float

    def state(self, node: NodeRecord, now: float) -> NodeLiveness:
        silent = now - node.last_seen
        if silent > self.lost_after:
            return NodeLiveness.LOST
        if silent > self.unreachable_after:
            return NodeLiveness.UNREACHABLE
        return NodeLiveness.READY if node.connected else NodeLiveness.DISCONNECTED


class Inventory:
    def __init__(self) -> None:
        self._nodes: dict[str, NodeRecord] = {}

    def get(self, node_id: str) -> NodeRecord | None:
        return self._nodes.get(node_id)

    def put(self, node: NodeRecord) -> None:
        self._nodes[node.node_id] = node

    def remove(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)

    def __iter__(self) -> Iterator[NodeRecord]:
        return iter(list(self._nodes.values()))

    def __len__(self) -> int:
        return len(self._nodes)
