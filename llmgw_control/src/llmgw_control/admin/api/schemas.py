"""The admin API's bodies and answers, as attrs classes.

These classes *are* the contract: requests are structured into them, answers unstructured from
them, and the OpenAPI document generated from them (see ``core``). Constraints sit in the
``schema`` metadata, so they are published and enforced from one place.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import attrs

from llmgw_shared.wire import EngineProvenance

from ...catalog import ModelConfig

NAME_RULES = {"minLength": 1, "maxLength": 200}
COUNT = {"minimum": 0}


def _name(doc: str = "") -> Any:
    return attrs.field(metadata={"schema": NAME_RULES, "doc": doc})


# --------------------------------------------------------------------------- nodes


@attrs.frozen
class GpuView:
    name: str
    memory_total_mib: int


@attrs.frozen
class FactsView:
    os: str
    arch: str
    cpu: str
    cores: int
    cpu_features: list[str]
    ram_total_mib: int
    gpus: list[GpuView]
    nvidia_driver: str | None
    # What the GPUs are reached through ("cuda", "rocm", "vulkan"; "" with none).
    gpu_backend: str = ""
    # Why the node, which has GPUs, serves on the CPU only ("" when it is not degraded): GPU
    # profiles are not placed there unless they say cpu_ok.
    degraded: str = ""


@attrs.frozen
class EngineOnNode:
    name: str
    version: str
    # The node's own words: "installed b11312", "installing: downloading ... (41%)", "failed: ...".
    state: str
    # Where the install came from, as the node's install manifest records it (null: configured
    # by path, not installed yet, or a node that predates provenance).
    provenance: EngineProvenance | None = None


@attrs.frozen
class ReplicaOnNode:
    id: str
    state: str
    port: int


@attrs.frozen
class NodeView:
    """A node: ``state`` is ready, disconnected, unreachable, lost, or registered (a node identity
    in the store that has not connected to this control daemon since it started)."""

    id: str
    state: str
    address: str
    cordoned: bool
    labels: dict[str, str]
    facts: FactsView
    # Host problems in the node's words, e.g. the CPU lacks AVX2 (llama.cpp will be slow).
    warnings: list[str]
    engines: list[EngineOnNode]
    shards: list[ReplicaOnNode]


@attrs.frozen
class NodeList:
    nodes: list[NodeView]
    # leader: this daemon's own fleet; standby: the leader's, as the store holds it (docs/failover.md).
    role: str = "leader"
    # The leader's address a standby knows of (null on the leader, or while no leader is known).
    leader: str | None = None


@attrs.frozen
class NodeAnswer:
    node: NodeView


@attrs.frozen
class DrainAnswer:
    node: NodeView
    # The replicas withdrawn from the gateway and told to drain.
    drained: list[str]


# --------------------------------------------------------------------------- models


@attrs.frozen
class ClaimView:
    ram_mib: int
    vram_mib: int


@attrs.frozen
class ReplicaOfModel:
    id: str
    node: str
    port: int
    state: str
    # What its node measured it to use (RSS of the engine's process tree, its GPU memory), as
    # placement accounts it; null until the node has measured it.
    used: ClaimView | None = None


@attrs.frozen
class AdapterOfModel:
    """A LoRA adapter of the profile (its own model name), and the ready replicas that hold it."""

    name: str
    size: int
    scale: float
    loaded_on: list[str]


@attrs.frozen
class ModelView:
    """One profile of a model: its replicas and, when none is ready, why (``status``)."""

    model: str
    profile: str
    key: str
    # config: from the config file (edit the file to change it); api: added through this API.
    source: str
    replicas: list[ReplicaOfModel]
    ready: int
    waiting_requests: int
    status: str
    claim: ClaimView
    adapters: list[AdapterOfModel] = attrs.Factory(list)


@attrs.frozen
class WeightsFileView:
    """One model file in a node's weights cache."""

    sha256: str
    size: int
    # When a replica last started on it or stopped using it (the node's record).
    last_used: datetime
    # A replica uses it now (the node says so, or control runs one there on it): never removed.
    in_use: bool
    # The profile keys of the replicas control runs there on it (none: kept, but unused).
    models: list[str]


@attrs.frozen
class NodeWeightsView:
    node: str
    # False: the node has not reported its weights (it is not connected, or predates reporting).
    reported: bool
    disk_free_mib: int
    weights: list[WeightsFileView]


@attrs.frozen
class WeightsList:
    nodes: list[NodeWeightsView]
    # leader: this daemon's own fleet; standby: the leader's, as the store holds it (docs/failover.md).
    role: str = "leader"
    # The leader's address a standby knows of (null on the leader, or while no leader is known).
    leader: str | None = None


@attrs.frozen
class ModelList:
    models: list[ModelView]
    # leader: this daemon's own fleet; standby: the leader's, as the store holds it (docs/failover.md).
    role: str = "leader"
    # The leader's address a standby knows of (null on the leader, or while no leader is known).
    leader: str | None = None


@attrs.frozen
class ModelDefinition:
    """A model's definition (one ``[[models]]`` entry) and where it came from."""

    model: ModelConfig
    source: str


# --------------------------------------------------------------------------- replicas, engines


@attrs.frozen
class ReplicaView:
    id: str
    # The profile key, model:profile.
    model: str
    node: str
    port: int
    # assigned, pending, downloading, starting, ready, draining, stopped, failed
    status: str
    detail: str
    draining: bool
    # Published to the gateway (receiving requests) right now.
    routable: bool
    in_flight: int
    # The engine's last output lines, as its node sent them with a crash or a failed start.
    last_lines: list[str] = attrs.Factory(list)
    # Requests the gateway sends it at once (0 while not published): what a capacity run measured
    # on its node's kind meeting the profile's objective, or else the profile's parallel.
    slots: int = 0


@attrs.frozen
class ReplicaLogs:
    """A replica's engine output: the last lines, or those after ``cursor`` (a follower's poll)."""

    replica: str
    model: str
    node: str
    status: str
    detail: str
    # "node": read from the engine's log on its node now; "failure report": the lines the node
    # sent with the failure (the node is not connected, or no longer has the output).
    source: str
    lines: list[str]
    # Give it back (``cursor=``) to get only what was written after these lines.
    cursor: str


@attrs.frozen
class ReplicaList:
    replicas: list[ReplicaView]
    # leader: this daemon's own fleet; standby: the leader's, as the store holds it (docs/failover.md).
    role: str = "leader"
    # The leader's address a standby knows of (null on the leader, or while no leader is known).
    leader: str | None = None


@attrs.frozen
class EngineNodeState:
    node: str
    state: str
    provenance: EngineProvenance | None = None


@attrs.frozen
class EngineView:
    name: str
    version: str
    release_api: str
    nodes: list[EngineNodeState]


@attrs.frozen
class EngineList:
    engines: list[EngineView]
    # leader: this daemon's own fleet; standby: the leader's, as the store holds it (docs/failover.md).
    role: str = "leader"
    # The leader's address a standby knows of (null on the leader, or while no leader is known).
    leader: str | None = None


# --------------------------------------------------------------------------- groups


@attrs.frozen
class GroupView:
    id: str
    name: str
    parent_id: str | None
    # org/team/project
    path: str
    created_at: datetime
    updated_at: datetime
    # The group's own setting; null: its parent's.
    priority: str | None
    # What its requests get: its own, else the nearest ancestor's, else interactive.
    effective_priority: str


@attrs.frozen
class GroupList:
    groups: list[GroupView]


@attrs.frozen
class GroupAnswer:
    group: GroupView


PriorityName = Literal["interactive", "batch"]
_PRIORITY_DOC = (
    "How the group's requests are ordered while they wait for a replica slot: interactive before "
    "batch (batch still gets a bounded share). null: the parent's; a root without one is interactive."
)


@attrs.frozen
class CreateGroup:
    name: str = _name("The group's name, unique among its siblings.")
    parent_id: str | None = attrs.field(default=None, metadata={"doc": "The parent group; null for a root."})
    priority: PriorityName | None = attrs.field(default=None, metadata={"doc": _PRIORITY_DOC})


@attrs.frozen
class PatchGroup:
    """Only the fields present change; ``parent_id: null`` makes the group a root, ``priority: null``
    makes it inherit its parent's."""

    name: str | None = attrs.field(default=None, metadata={"schema": NAME_RULES})
    parent_id: str | None = None
    priority: PriorityName | None = attrs.field(default=None, metadata={"doc": _PRIORITY_DOC})


# --------------------------------------------------------------------------- keys


@attrs.frozen
class KeyView:
    """A key as stored: never its secret."""

    id: str
    name: str
    group_id: str
    # null: every model.
    models: list[str] | None
    admin: bool
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    # active, revoked or expired
    state: str


@attrs.frozen
class KeyList:
    keys: list[KeyView]


@attrs.frozen
class KeyAnswer:
    key: KeyView


@attrs.frozen
class CreatedKeyAnswer:
    key: KeyView
    # The only time the secret is shown: it is stored as a digest.
    secret: str


@attrs.frozen
class CreateKey:
    name: str = _name()
    group_id: str = _name()
    models: list[str] | None = attrs.field(
        default=None,
        metadata={
            "schema": {"maxItems": 1000, "items": NAME_RULES},
            "doc": "The models (or model:profile) this key may use; null or absent: every model.",
        },
    )
    admin: bool = False
    expires_at: datetime | None = None


# --------------------------------------------------------------------------- quotas


@attrs.frozen
class QuotaBody:
    """Limits for a group; null or absent: no limit of that kind; 0 pauses that kind."""

    requests_per_minute: int | None = attrs.field(default=None, metadata={"schema": COUNT})
    tokens_per_minute: int | None = attrs.field(default=None, metadata={"schema": COUNT})
    tokens_per_day: int | None = attrs.field(default=None, metadata={"schema": COUNT})
    concurrent_requests: int | None = attrs.field(default=None, metadata={"schema": COUNT})


@attrs.frozen
class QuotaView:
    group_id: str
    path: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    tokens_per_day: int | None
    concurrent_requests: int | None


@attrs.frozen
class QuotaList:
    quotas: list[QuotaView]


@attrs.frozen
class QuotaAnswer:
    quota: QuotaView


# --------------------------------------------------------------------------- usage, capacity


@attrs.frozen
class UsageRow:
    hour: datetime
    key_id: str
    group_id: str
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int


@attrs.frozen
class Totals:
    requests: int
    prompt_tokens: int
    completion_tokens: int


@attrs.frozen
class UsageAnswer:
    usage: list[UsageRow]
    totals: Totals


@attrs.frozen
class CapacityView:
    id: str
    model: str
    profile: str
    node_id: str
    engine: str
    concurrency: int
    tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    measured_at: datetime
    detail: dict[str, Any]


@attrs.frozen
class CapacityList:
    capacity: list[CapacityView]
