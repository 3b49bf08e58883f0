"""How the fleet looks to the admin API: nodes and model profiles as the API's answer classes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..catalog import Claim, Resolved
from ..fleet.inventory import NodeRecord
from ..fleet.lifecycle import ReplicaStatus
from ..store import NodeIdentity
from .api.schemas import (
    AdapterOfModel,
    ClaimView,
    EngineOnNode,
    FactsView,
    GpuView,
    ModelView,
    NodeView,
    NodeWeightsView,
    ReplicaOfModel,
    ReplicaOnNode,
    WeightsFileView,
)

if TYPE_CHECKING:
    from ..fleet.fleet import Fleet


def node_view(fleet: Fleet, node: NodeRecord, now: float) -> NodeView:
    facts = node.facts
    return NodeView(
        id=node.node_id,
        state=fleet.reconciler.liveness.state(node, now),
        address=node.address,
        cordoned=fleet.reconciler.is_cordoned(node.node_id),
        labels=dict(node.labels),
        facts=FactsView(
            os=facts.os_name,
            arch=facts.arch,
            cpu=facts.cpu_model,
            cores=facts.cores,
            cpu_features=list(facts.cpu_features),
            ram_total_mib=facts.ram_total_mib,
            gpus=[GpuView(g.name, g.memory_total_mib) for g in facts.gpus],
            nvidia_driver=facts.nvidia_driver,
            gpu_backend=facts.gpu_backend,
            degraded=facts.degraded,
        ),
        warnings=list(facts.warnings),
        engines=[EngineOnNode(e.name, e.version, e.describe(), e.provenance) for e in node.engines.values()],
        shards=[ReplicaOnNode(s.replica_id, s.describe(), s.port) for s in node.replicas.values()],
    )


def registered_node_view(fleet: Fleet, identity: NodeIdentity) -> NodeView:
    """A node with a stored identity that has not connected to this daemon since it started."""
    return NodeView(
        id=identity.id,
        state="registered",
        address="",
        cordoned=identity.cordoned or fleet.reconciler.is_cordoned(identity.id),
        labels=dict(identity.labels),
        facts=FactsView(os="", arch="", cpu="", cores=0, cpu_features=[], ram_total_mib=0, gpus=[], nvidia_driver=None),
        warnings=[],
        engines=[],
        shards=[],
    )


def model_view(fleet: Fleet, resolved: Resolved) -> ModelView:
    profile_key = resolved.profile_key
    reconciler = fleet.reconciler
    replicas = [r for r in reconciler.records.values() if r.profile_key == profile_key]
    ready = [r for r in replicas if r.status == ReplicaStatus.READY and not r.draining]
    claim = reconciler.claims.get(profile_key, Claim(0))
    return ModelView(
        model=resolved.model.name,
        profile=resolved.profile.name,
        key=profile_key,
        source=fleet.catalog.source(resolved.model.name),
        replicas=[
            ReplicaOfModel(
                r.replica_id,
                r.node_id,
                r.port,
                f"{r.status}: {r.detail}" if r.detail else r.status,
                ClaimView(r.used.ram_mib, r.used.vram_mib) if r.used else None,
            )
            for r in replicas
        ],
        ready=len(ready),
        waiting_requests=reconciler.demand.waiting(profile_key),
        status="ready" if ready else reconciler.status(profile_key),
        claim=ClaimView(claim.ram_mib, claim.vram_mib),
        adapters=adapter_views(fleet, resolved),
    )


def adapter_views(fleet: Fleet, resolved: Resolved) -> list[AdapterOfModel]:
    """The profile's adapters, each with the replicas the gateway may send its requests to."""
    published = fleet.reconciler.replicas.for_model(resolved.profile_key)
    return [
        AdapterOfModel(
            a.name, a.weights.size, a.scale, sorted(r.id for r in published if any(n == a.name for n, _ in r.adapters))
        )
        for a in resolved.profile.adapters
    ]


def node_weights_view(fleet: Fleet, node: NodeRecord) -> NodeWeightsView:
    """What a node holds in its weights cache, and which of control's replicas there use each file."""
    using = fleet.reconciler.weights_in_use(node.node_id)
    files = []
    for held in node.weights or []:
        models = sorted(using.get(held.sha256, []))
        files.append(
            WeightsFileView(
                held.sha256, held.size, datetime.fromtimestamp(held.last_used, UTC), held.in_use or bool(models), models
            )
        )
    return NodeWeightsView(node.node_id, node.weights is not None, node.facts.disk_free_mib, files)
