"""Read-only views of the fleet on the admin listener (the full REST API builds on these)."""

from __future__ import annotations

from typing import Any

import trio
from quart import jsonify
from quart_trio import QuartTrio


def node_view(fleet: Any, node: Any, now: float) -> dict[str, Any]:
    facts = node.facts
    return {
        "id": node.node_id,
        "state": fleet.reconciler.liveness.state(node, now),
        "address": node.address,
        "cordoned": node.cordoned,
        "labels": node.labels,
        "facts": {
            "os": facts.os_name, "arch": facts.arch, "cpu": facts.cpu_model, "cores": facts.cores,
            "cpu_features": facts.cpu_features, "ram_total_mib": facts.ram_total_mib,
            "gpus": [{"name": g.name, "memory_total_mib": g.memory_total_mib} for g in facts.gpus],
            "nvidia_driver": facts.nvidia_driver,
        },
        "warnings": list(facts.warnings),
        "engines": [{"name": e.name, "version": e.version, "state": e.describe()} for e in node.engines.values()],
        "shards": [{"id": s.shard_id, "state": s.describe(), "port": s.port} for s in node.shards.values()],
    }


def model_view(fleet: Any, resolved: Any) -> dict[str, Any]:
    key = resolved.key
    replicas = [r for r in fleet.reconciler.shards.values() if r.key == key]
    ready = [r for r in replicas if r.status == "ready" and not r.draining]
    return {
        "model": resolved.model.name,
        "profile": resolved.profile.name,
        "key": key,
        "replicas": [{"id": r.shard_id, "node": r.node_id, "port": r.port,
                      "state": f"{r.status}: {r.detail}" if r.detail else r.status} for r in replicas],
        "ready": len(ready),
        "waiting_requests": fleet.reconciler.waiting.get(key, 0),
        "status": "ready" if ready else fleet.reconciler.status(key),
    }


def register_fleet_views(app: QuartTrio, fleet: Any) -> None:
    @app.get("/api/v1/nodes")
    async def nodes() -> Any:
        now = trio.current_time()
        return jsonify({"nodes": [node_view(fleet, n, now) for n in fleet.inventory]})

    @app.get("/api/v1/models")
    async def models() -> Any:
        return jsonify({"models": [model_view(fleet, r) for r in fleet.catalog.all_profiles()]})
