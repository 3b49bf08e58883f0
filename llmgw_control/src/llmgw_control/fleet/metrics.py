"""Fleet metrics for ``/metrics``: a custom collector that reads the live objects at scrape time.

Nothing is counted on the data path or in the reconciler for this: each scrape walks the
inventory, the reconciler's replica records and the activator's waiting counts (all in memory, a
few hundred objects at most) and reports what they say now. Scrapes run in the admin listener's
trio task, the same thread that mutates these objects, so there is no torn read.

Label values come from node ids (nodes that joined with a token), configured model/profile keys
and fixed state words, never from client input, so the series stay bounded.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from .inventory import NodeLiveness
from .lifecycle import HOLDING, ReplicaStatus

# Every state is exported, with 0 when none is in it, so an alert on e.g. lost > 0 sees a series.
NODE_STATES = tuple(str(s) for s in NodeLiveness)
REPLICA_STATES = tuple(str(s) for s in ReplicaStatus)


def _lease_view(fleet: Any) -> tuple[bool, str, str, int | None] | None:
    """(leader?, holder, address, epoch) of the lease as this daemon knows it, or None if unknown."""
    leadership = getattr(fleet, "leadership", None)
    if leadership is not None:
        role, keeper = leadership.role, leadership.keeper
        if role.leader:
            return True, keeper.holder, keeper.address, role.epoch
        return False, role.leader_holder or "", role.leader_address or "", None
    # Without a lease keeper (older wiring, tests) the agents' role is all there is.
    role = getattr(fleet.agents, "role", None)
    if role is None:
        return None
    return bool(role.leader), "", role.leader_address or "", None


class FleetCollector(Collector):
    def __init__(self, fleet: Any, *, clock: Callable[[], float] = trio.current_time) -> None:
        self.fleet = fleet
        self.clock = clock

    def describe(self) -> list[Any]:
        # Empty: the registry must not call collect() at registration time (that is outside trio).
        return []

    def collect(self) -> Iterator[Any]:
        # Every family is built before the first is handed out: one snapshot of the reconciler.
        families = [*self._node_families(), *self._model_families()]
        yield from families
        yield from self._leadership()

    def _node_families(self) -> list[Any]:
        fleet = self.fleet
        reconciler = fleet.reconciler
        now = self.clock()
        reserved = reconciler.config.reserved_ram_mib

        nodes = GaugeMetricFamily("llmgw_fleet_nodes", "Nodes known to control, by liveness state.", labels=["state"])
        degraded = GaugeMetricFamily(
            "llmgw_fleet_node_degraded",
            "1 when the node has GPUs but serves on its CPU "
            "only (no GPU build runs there); GPU profiles are not placed on it.",
            labels=["node"],
        )
        cordoned = GaugeMetricFamily(
            "llmgw_fleet_node_cordoned", "1 when the node takes no new replicas.", labels=["node"]
        )
        node_state = GaugeMetricFamily(
            "llmgw_fleet_node_state", "1 for the node's current liveness state.", labels=["node", "state"]
        )
        engines = GaugeMetricFamily(
            "llmgw_fleet_engine_state",
            "1 per engine build on a node, labelled with its status (installing, installed, configured, failed, ...).",
            labels=["node", "engine", "version", "status"],
        )
        ram = GaugeMetricFamily(
            "llmgw_fleet_node_ram_mib",
            "RAM per node in MiB: usable (total minus the reserve), claimed by replicas, free.",
            labels=["node", "kind"],
        )
        vram = GaugeMetricFamily(
            "llmgw_fleet_node_vram_mib", "GPU memory per node in MiB: total, claimed, free.", labels=["node", "kind"]
        )
        node_replicas = GaugeMetricFamily(
            "llmgw_fleet_node_replicas", "Replicas holding resources on a node.", labels=["node"]
        )

        claimed: dict[str, tuple[int, int, int]] = {}
        for record in reconciler.records.values():
            # Claims a replica still holds: a stopped or failed one has released its memory.
            if record.status in HOLDING:
                ram_c, vram_c, count = claimed.get(record.node_id, (0, 0, 0))
                held = record.holding
                claimed[record.node_id] = (ram_c + held.ram_mib, vram_c + held.vram_mib, count + 1)

        by_state: Counter[str] = Counter()
        for node in fleet.inventory:
            state = reconciler.liveness.state(node, now)
            by_state[state] += 1
            node_state.add_metric([node.node_id, state], 1)
            cordoned.add_metric([node.node_id], 1 if node.cordoned else 0)
            degraded.add_metric([node.node_id], 1 if node.facts.degraded else 0)
            for engine in node.engines.values():
                engines.add_metric([node.node_id, engine.name, engine.version, engine.status], 1)
            facts = node.facts
            usable = max(0, facts.ram_total_mib - reserved)
            gpu_total = sum(g.memory_total_mib for g in facts.gpus)
            ram_c, vram_c, count = claimed.get(node.node_id, (0, 0, 0))
            for kind, value in (("usable", usable), ("claimed", ram_c), ("free", max(0, usable - ram_c))):
                ram.add_metric([node.node_id, kind], value)
            for kind, value in (("total", gpu_total), ("claimed", vram_c), ("free", max(0, gpu_total - vram_c))):
                vram.add_metric([node.node_id, kind], value)
            node_replicas.add_metric([node.node_id], count)
        for state in sorted(set(NODE_STATES) | set(by_state)):
            nodes.add_metric([state], by_state.get(state, 0))
        return [nodes, node_state, cordoned, degraded, engines, ram, vram, node_replicas]

    def _model_families(self) -> list[Any]:
        fleet = self.fleet
        reconciler = fleet.reconciler
        replicas = GaugeMetricFamily(
            "llmgw_fleet_replicas", "Replicas per model profile, by state.", labels=["model", "state"]
        )
        counts: Counter[tuple[str, str]] = Counter(
            (r.profile_key, "draining" if r.draining else str(r.status)) for r in reconciler.records.values()
        )
        for resolved in fleet.catalog.all_profiles():
            for state in REPLICA_STATES:
                counts.setdefault((resolved.profile_key, state), 0)
        for (profile_key, state), value in sorted(counts.items()):
            replicas.add_metric([profile_key, state], value)

        waiting = GaugeMetricFamily(
            "llmgw_fleet_waiting_requests",
            "Requests held by the activator until a replica of the model is ready.",
            labels=["model"],
        )
        for resolved in fleet.catalog.all_profiles():
            waiting.add_metric([resolved.profile_key], reconciler.demand.waiting(resolved.profile_key))
        queue = GaugeMetricFamily(
            "llmgw_fleet_queue_depth", "All requests held by the activator.", value=fleet.activator.queue_depth()
        )

        evictions = CounterMetricFamily(
            "llmgw_fleet_evictions",
            "Replicas of the model profile evicted to make room for another model.",
            labels=["model"],
        )
        for resolved in fleet.catalog.all_profiles():
            evictions.add_metric([resolved.profile_key], reconciler.evictions.get(resolved.profile_key, 0))

        return [replicas, waiting, queue, evictions]

    def _leadership(self) -> Iterator[Any]:
        view = _lease_view(self.fleet)
        if view is None:
            return
        leader, holder, address, epoch = view
        yield GaugeMetricFamily(
            "llmgw_control_leader", "1 when this control daemon holds the lease (the leader).", value=1 if leader else 0
        )
        info = InfoMetricFamily("llmgw_control_lease", "The lease holder as this daemon knows it (empty: unknown).")
        info.add_metric([], {"holder": holder, "address": address})
        yield info
        if epoch is not None:
            yield GaugeMetricFamily(
                "llmgw_control_lease_epoch", "The leader's fencing token (lease epoch).", value=epoch
            )


# One collector per registry: a test (or a restart in-process) that runs control twice on one
# registry re-points the existing collector instead of failing on duplicate series.
_registered: weakref.WeakKeyDictionary[CollectorRegistry, FleetCollector] = weakref.WeakKeyDictionary()


def register_fleet_metrics(registry: CollectorRegistry, fleet: Any) -> FleetCollector:
    """Expose ``fleet`` (``app.Fleet``) on ``registry``; returns the collector."""
    collector = _registered.get(registry)
    if collector is None:
        collector = _registered[registry] = FleetCollector(fleet)
        registry.register(collector)
    else:
        collector.fleet = fleet
    return collector
