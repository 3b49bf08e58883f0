"""What each node is, has and runs, as its reports said: the reconciler's view of "actual".

Kept in memory on the leader. A node's liveness is derived from when it was last heard from,
not from whether its socket is open: a hung node (stopped process, cut network) keeps its
socket open and sends nothing, and only the missing heartbeats reveal it.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from llmgw_shared.facts import HostFacts
from llmgw_shared.wire import EngineState, ShardState, WeightsHeld


@attrs.define
class NodeRecord:
    node_id: str
    address: str
    facts: HostFacts
    engines: dict[tuple[str, str], EngineState] = attrs.Factory(dict)
    shards: dict[str, ShardState] = attrs.Factory(dict)
    connected: bool = True
    last_seen: float = 0.0
    connected_since: float = 0.0
    labels: dict[str, str] = attrs.Factory(dict)
    cordoned: bool = False
    # ``shards`` came from a hello, a complete list, and the reconciler has not yet compared it
    # with what it placed there (a record the list lacks is gone). Heartbeats and shard_state
    # reports only add to ``shards``: they carry what changed.
    full_report_pending: bool = True
    # Its weights cache as it last reported it (None: not reported; a node from before reports).
    weights: list[WeightsHeld] | None = None

    def engine(self, name: str, version: str) -> EngineState | None:
        return self.engines.get((name, version))

    def update_engines(self, states: list[EngineState]) -> None:
        for state in states:
            self.engines[(state.name, state.version)] = state

    def update_shards(self, states: list[ShardState]) -> None:
        for state in states:
            self.shards[state.shard_id] = state


@attrs.frozen
class Liveness:
    unreachable_after: float
    lost_after: float

    def state(self, node: NodeRecord, now: float) -> str:
        silent = now - node.last_seen
        if silent > self.lost_after:
            return "lost"
        if silent > self.unreachable_after:
            return "unreachable"
        return "ready" if node.connected else "disconnected"


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
