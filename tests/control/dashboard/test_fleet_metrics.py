"""The fleet collector: read at scrape time from the live objects (here small stand-ins)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import attrs
from prometheus_client import CollectorRegistry

from llmgw_control.catalog import Claim
from llmgw_control.fleet.inventory import Inventory, Liveness, NodeRecord
from llmgw_control.fleet.metrics import register_fleet_metrics
from llmgw_control.fleet.reconciler import ReconcilerConfig, ReplicaRecord
from llmgw_control.gateway.demand import WaitingRequests
from llmgw_shared.facts import GpuFacts, unprobed
from llmgw_shared.wire import EngineState


def fleet(now: float = 100.0) -> Any:
    inventory = Inventory()
    gpu = GpuFacts(index=0, uuid="GPU-1", name="L4", memory_total_mib=24000, memory_free_mib=24000)
    facts = attrs.evolve(unprobed(), ram_total_mib=8192, gpus=[gpu])
    up = NodeRecord("n1", "10.0.0.1", facts, last_seen=now)
    up.update_engines([EngineState("llama.cpp", "b1", "failed", detail="glibc too old")])
    inventory.put(up)
    inventory.put(
        NodeRecord(
            "n2",
            "10.0.0.2",
            attrs.evolve(facts, degraded="this node has NVIDIA GPUs but its llama.cpp engine is a CPU build"),
            last_seen=now - 50,
            cordoned=True,
        )
    )
    replicas = {
        "s1": ReplicaRecord("s1", "tiny:cpu", "n1", 20000, Claim(1000, 2000), status="ready"),
        "s2": ReplicaRecord("s2", "tiny:cpu", "n1", 20001, Claim(500), status="failed"),
    }
    demand = WaitingRequests()
    demand.queued("tiny:cpu", 3)
    reconciler = SimpleNamespace(
        records=replicas,
        demand=demand,
        liveness=Liveness(2.0, 10.0),
        config=ReconcilerConfig(reserved_ram_mib=192),
        evictions={"tiny:cpu": 2},
    )
    catalog = SimpleNamespace(
        all_profiles=lambda: [SimpleNamespace(profile_key="tiny:cpu"), SimpleNamespace(profile_key="big:gpu")]
    )
    activator = SimpleNamespace(queue_depth=lambda: 3)
    role = SimpleNamespace(leader=False, leader_address="ws://10.0.0.7:8082/agent/v1", leader_holder="c7", epoch=None)
    leadership = SimpleNamespace(role=role, keeper=SimpleNamespace(holder="c1", address="ws://c1"))
    return SimpleNamespace(
        inventory=inventory,
        reconciler=reconciler,
        catalog=catalog,
        activator=activator,
        agents=SimpleNamespace(),
        leadership=leadership,
    )


def test_the_collector_reports_the_live_state() -> None:
    registry = CollectorRegistry()
    f = fleet()
    collector = register_fleet_metrics(registry, f)
    collector.clock = lambda: 100.0
    get = registry.get_sample_value
    assert get("llmgw_fleet_nodes", {"state": "ready"}) == 1
    assert get("llmgw_fleet_nodes", {"state": "lost"}) == 1  # silent for 50 s > lost_after
    assert get("llmgw_fleet_nodes", {"state": "unreachable"}) == 0  # every state, even when empty
    assert get("llmgw_fleet_node_cordoned", {"node": "n2"}) == 1
    assert get("llmgw_fleet_node_degraded", {"node": "n2"}) == 1
    assert get("llmgw_fleet_node_degraded", {"node": "n1"}) == 0
    assert (
        get("llmgw_fleet_engine_state", {"node": "n1", "engine": "llama.cpp", "version": "b1", "status": "failed"}) == 1
    )
    # The failed replica released its claim; the ready one holds 1000 MiB RAM and 2000 MiB VRAM.
    assert get("llmgw_fleet_node_ram_mib", {"node": "n1", "kind": "usable"}) == 8000
    assert get("llmgw_fleet_node_ram_mib", {"node": "n1", "kind": "claimed"}) == 1000
    assert get("llmgw_fleet_node_ram_mib", {"node": "n1", "kind": "free"}) == 7000
    assert get("llmgw_fleet_node_vram_mib", {"node": "n1", "kind": "free"}) == 22000
    assert get("llmgw_fleet_node_replicas", {"node": "n1"}) == 1
    assert get("llmgw_fleet_replicas", {"model": "tiny:cpu", "state": "ready"}) == 1
    assert get("llmgw_fleet_replicas", {"model": "tiny:cpu", "state": "failed"}) == 1
    assert get("llmgw_fleet_replicas", {"model": "big:gpu", "state": "ready"}) == 0
    assert get("llmgw_fleet_waiting_requests", {"model": "tiny:cpu"}) == 3
    assert get("llmgw_fleet_waiting_requests", {"model": "big:gpu"}) == 0
    assert get("llmgw_fleet_queue_depth") == 3
    assert get("llmgw_fleet_evictions_total", {"model": "tiny:cpu"}) == 2
    assert get("llmgw_fleet_evictions_total", {"model": "big:gpu"}) == 0
    # A standby: not the leader, and it names the leader it knows of.
    assert get("llmgw_control_leader") == 0
    assert get("llmgw_control_lease_info", {"holder": "c7", "address": "ws://10.0.0.7:8082/agent/v1"}) == 1
    assert get("llmgw_control_lease_epoch") is None

    # Scraped again after a change: nothing was cached.
    f.reconciler.records["s1"].status = "draining"
    f.leadership.role = SimpleNamespace(leader=True, leader_address=None, leader_holder=None, epoch=7)
    assert get("llmgw_fleet_replicas", {"model": "tiny:cpu", "state": "draining"}) == 1
    assert get("llmgw_control_leader") == 1
    assert get("llmgw_control_lease_info", {"holder": "c1", "address": "ws://c1"}) == 1
    assert get("llmgw_control_lease_epoch") == 7


def test_registering_twice_on_one_registry_repoints_the_collector() -> None:
    registry = CollectorRegistry()
    first = register_fleet_metrics(registry, fleet())
    second_fleet = fleet()
    second_fleet.activator = SimpleNamespace(queue_depth=lambda: 9)
    assert register_fleet_metrics(registry, second_fleet) is first
    first.clock = lambda: 100.0
    assert registry.get_sample_value("llmgw_fleet_queue_depth") == 9


def test_claimed_memory_is_what_a_running_replica_was_measured_to_use() -> None:
    registry = CollectorRegistry()
    f = fleet()
    collector = register_fleet_metrics(registry, f)
    collector.clock = lambda: 100.0
    f.reconciler.records["s1"].used = Claim(600, 1500)  # claimed 1000 RAM / 2000 VRAM, measured less
    assert registry.get_sample_value("llmgw_fleet_node_ram_mib", {"node": "n1", "kind": "claimed"}) == 600
    assert registry.get_sample_value("llmgw_fleet_node_vram_mib", {"node": "n1", "kind": "claimed"}) == 1500
