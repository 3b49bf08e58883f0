"""What the reconciler keeps and is configured by: its settings, the record of each replica it placed
or adopted, and the interface it sends commands through (``agents.AgentService``)."""

from __future__ import annotations

from typing import Protocol

import attrs

from llmgw_shared.wire import Command

from ..catalog import Claim
from . import lifecycle
from .lifecycle import ReplicaStatus
from .plan import Assignment

# Replicas forgotten recently, kept with their final words: a failed start is forgotten within a
# pass (a replacement is placed), and the operator asking why must still get its lines. A hundred
# is a day of one model failing every fifteen minutes; each holds at most 30 lines.
KEEP_ENDED = 100


@attrs.frozen
class EndedReplica:
    """A forgotten replica's record as it ended: enough to answer for its logs."""

    replica_id: str
    profile_key: str
    node_id: str
    status: ReplicaStatus
    detail: str
    last_lines: list[str]


class Dispatcher(Protocol):
    def send(self, node_id: str, command: Command) -> bool:
        """Queue a command for a node; False when the node is not connected."""
        ...


@attrs.frozen
class ReconcilerConfig:
    interval: float = 2.0
    port_min: int = 20000
    port_max: int = 20999
    backoff_base: float = 5.0
    backoff_cap: float = 300.0
    # Moving replicas off lost nodes: a burst, then this many per minute.
    reschedule_burst: int = 10
    reschedules_per_minute: float = 10.0
    # RAM kept free on every node for the OS and the node daemon.
    reserved_ram_mib: int = 512
    # Seconds every slot of a model must stay busy, with nothing queued, before that counts as
    # demand for another replica (queued requests count at once). A model at exactly its
    # capacity serves, but the next request will wait; a moment at capacity is not demand.
    # Ten seconds: Knative's panic window (6 s), in which it scales on a burst, plus a pass.
    saturated_after: float = 10.0
    # A StartReplica the node has not reported on after this long is failed with that reason (the
    # node acknowledged it and then said nothing): nothing waits in "assigned" forever. A node
    # reports a new replica within a heartbeat (5 s); a minute allows for a congested node.
    assigned_timeout: float = 60.0
    # A lost node is forgotten (gone from /api/v1/nodes and /metrics, its records dropped) after
    # this long without a word: a day, as Nomad's node_gc_threshold (24h), so an operator and the
    # alerts see it lost first, and a fleet of short-lived nodes does not grow control's memory.
    forget_nodes_after: float = 86400.0
    # A replica is never evicted to make room for another model within this many seconds of its
    # placement: two models that do not fit together would otherwise swap on every pass, each
    # paying its load (seconds to minutes) and neither serving. A minute lets a loaded model
    # serve what it was loaded for.
    evict_min_age: float = 60.0
    # Requests queued this long for a model waiting for room make a busy resident model yield
    # (drained, then evicted) instead of only idle ones: a steady stream of requests for the
    # resident model must not starve the other. Half the activator's default max_wait (60 s), so
    # the waiting requests are still there when their model has loaded.
    yield_after: float = 30.0
    # Model files no replica on a node used for this long are removed from it (0: never by age;
    # files are still removed, least recently used first, when a download would not fit). A
    # week: a model used once a week stays, one dropped from the catalog goes within days.
    weights_keep_for: float = 604800.0


@attrs.define
class ReplicaRecord:
    replica_id: str
    profile_key: str
    node_id: str
    port: int
    claim: Claim
    status: ReplicaStatus = ReplicaStatus.ASSIGNED
    detail: str = ""
    draining: bool = False
    ready_since: float | None = None
    created_at: float = 0.0
    # Where the gateway reaches it: the node's address when control placed (or adopted) it. A
    # later hello cannot move a replica, and its bearer key, to another address.
    address: str = ""
    # The engine's last output lines, as the node sent them with a crash or a failed start: the
    # failure is shown with them (the API's replica and logs answers), not without.
    last_lines: list[str] = attrs.Factory(list)
    # What the node last measured it to use (its process tree's RSS and GPU memory), if it has.
    used: Claim | None = None
    # The GPUs placement put its VRAM on (empty: none, or adopted without knowing).
    devices: tuple[int, ...] = ()
    # The LoRA adapters its node reports loaded (names): what the gateway may send it.
    adapters: tuple[str, ...] = ()

    @property
    def holding(self) -> Claim:
        """What it takes from its node's memory: as measured once it runs, its claim until then."""
        return self.used if self.used is not None else self.claim

    def as_assignment(self, last_used: float, *, busy: bool = False) -> Assignment:
        return Assignment(
            self.replica_id,
            self.profile_key,
            self.node_id,
            self.port,
            self.claim,
            self.status,
            self.detail,
            self.draining,
            last_used,
            self.used,
            busy,
            self.created_at,
            self.devices,
        )

    def move(self, status: ReplicaStatus, detail: str | None = None) -> None:
        """A transition control makes (or applies from a report it checked): the table decides."""
        self.status = lifecycle.check(self.replica_id, self.status, status)
        if detail is not None:
            self.detail = detail
