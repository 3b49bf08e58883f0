"""The reconciler's decision, as a pure function: desired + actual + now -> actions.

Everything here takes plain values and returns plain values -- no sockets, no clock, no
randomness -- so every placement rule is tested directly, and the loop that performs the actions
stays small.

When a demanded model fits on no node, idle replicas are evicted to make room (``eviction``
says which and why); memory is accounted from what running replicas were measured to use, where
their node has reported it, and from the claim otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from llmgw_shared.engine_lifecycle import SERVES, EngineInstall
from llmgw_shared.wire import EngineState

from ..catalog import Claim
from . import gpus as gpu_fit
from .eviction import Room, make_room
from .inventory import NodeLiveness
from .lifecycle import TERMINAL, ReplicaStatus


@attrs.frozen
class Demand:
    """One profile: what it needs and how many replicas are wanted now."""

    profile_key: str
    engine: tuple[str, str]
    claim: Claim
    wanted: int
    labels: dict[str, str] = attrs.Factory(dict)
    # Replicas of this profile eviction never goes below.
    min_replicas: int = 0
    # Requests have waited for this profile longer than the reconciler's ``yield_after``: busy
    # replicas of other models may be evicted for it (fairness under swapping).
    starved: bool = False
    # What one replica was measured to use on nodes of a kind (``PlanNode.kind``), where one ran
    # there: it corrects ``claim`` for the next placement on that kind.
    claim_by_kind: dict[str, Claim] = attrs.Factory(dict)
    # GPUs one replica's VRAM claim is split over (tensor split).
    gpus: int = 1
    # Seconds requests have waited for it without a break: the longest waiting is placed first,
    # so the room evicted for a starved model is not taken by the model that yielded it.
    waited: float = 0.0
    # Generation tokens/s capacity runs measured per hardware (``PlanNode.hardware``) for this
    # engine version: among nodes that fit, the faster hardware is chosen.
    throughput_by_hardware: dict[str, float] = attrs.Factory(dict)
    # A GPU profile (one with a VRAM claim) that may run on the CPU of a degraded node.
    cpu_ok: bool = False
    # Only nodes whose engine build carries this backend (its provenance's); "": any.
    backend: str = ""

    def claim_on(self, kind: str) -> Claim:
        return self.claim_by_kind.get(kind, self.claim)


@attrs.frozen
class PlanNode:
    node_id: str
    state: NodeLiveness
    cordoned: bool
    labels: dict[str, str]
    engines: dict[tuple[str, str], EngineState]
    ram_mib: int
    vram_mib: int
    # Ports the node reports in use by replicas control may not know about.
    busy_ports: frozenset[int] = frozenset()
    # Nodes of one kind run a profile alike (``fleet.measured.node_kind``).
    kind: str = ""
    # Each GPU: (index, total MiB). A VRAM claim is fitted on specific GPUs of these.
    gpus: tuple[tuple[int, int], ...] = ()
    # Its kind and CPU model (``fleet.capacity.hardware_of``): what capacity runs are compared by.
    hardware: str = ""
    # Why the node, which has GPUs, can only serve on its CPU ("" when it is not degraded): GPU
    # profiles are not placed there unless they say ``cpu_ok``, and those that are get no GPUs.
    degraded: str = ""

    @property
    def schedulable(self) -> bool:
        return self.state == NodeLiveness.READY and not self.cordoned


@attrs.frozen
class Assignment:
    replica_id: str
    profile_key: str
    node_id: str
    port: int
    claim: Claim
    status: ReplicaStatus
    detail: str = ""
    draining: bool = False
    # For choosing which replica to drain when there are too many.
    last_used: float = 0.0
    # What the node measured it to use (None until it reported a measurement).
    used: Claim | None = None
    # Requests are in flight on it, or queued for its profile.
    busy: bool = False
    # When control placed (or adopted) it: eviction spares the young (``evict_min_age``).
    started_at: float = 0.0
    # The GPUs its VRAM is on (empty: not known, or none).
    devices: tuple[int, ...] = ()

    @property
    def live(self) -> bool:
        return not self.draining and self.status not in TERMINAL

    @property
    def holding(self) -> Claim:
        """The memory it takes from its node: as measured once it runs, the claim until then."""
        return self.used if self.used is not None else self.claim


@attrs.frozen
class Start:
    node_id: str
    profile_key: str
    port: int
    claim: Claim
    # The GPUs it is to run on (empty: no VRAM claim, or a node that lists no GPUs).
    devices: tuple[int, ...] = ()


@attrs.frozen
class Drain:
    replica_id: str
    node_id: str


@attrs.frozen
class Stop:
    replica_id: str
    node_id: str
    reason: str


@attrs.frozen
class Evict:
    """Drain an idle replica to make room for ``for_profile_key``; its profile goes back to scale from zero."""

    replica_id: str
    node_id: str
    profile_key: str
    for_profile_key: str


@attrs.frozen
class Forget:
    """Drop an assignment (its node is lost, or it stopped): a replacement may be placed."""

    replica_id: str
    reason: str


Action = Start | Drain | Stop | Forget | Evict


@attrs.frozen
class Plan:
    actions: list[Action]
    # Why a profile has fewer replicas than wanted, in the words an operator needs.
    blocked: dict[str, str]
    # Assignments moved off lost nodes in this plan: what the caller spends from its budget.
    rescheduled: int = 0


@attrs.frozen
class PlanLimits:
    port_min: int = 20000
    port_max: int = 20999
    # Assignments on lost nodes moved elsewhere in this pass at most (the caller's token bucket:
    # it spends ``Plan.rescheduled``), so a network blip that loses every node does not restart
    # every model at once.
    reschedule_budget: int = 1_000_000
    # Replicas younger than this (seconds since placed) are never evicted (no thrash).
    evict_min_age: float = 60.0


def _labels_match(required: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in required.items())


def _free_port(node: PlanNode, used: set[int], limits: PlanLimits) -> int | None:
    for port in range(limits.port_min, limits.port_max + 1):
        if port not in used and port not in node.busy_ports:
            return port
    return None


def plan(
    demands: Iterable[Demand],
    nodes: Iterable[PlanNode],
    assignments: Iterable[Assignment],
    *,
    backoff: dict[tuple[str, str], tuple[float, str]],
    now: float,
    limits: PlanLimits = PlanLimits(),
) -> Plan:
    """``backoff`` maps (profile key, node_id) to (retry-after time, last failure) after failed starts."""
    node_map = {n.node_id: n for n in nodes}
    actions: list[Action] = []
    blocked: dict[str, str] = {}
    budget = limits.reschedule_budget
    kept: list[Assignment] = []
    for assignment in assignments:
        node = node_map.get(assignment.node_id)
        if node is None or node.state == NodeLiveness.LOST:
            if assignment.live:
                # Only a live replica is moved (its replacement placed below), so only it costs.
                if budget <= 0:
                    kept.append(assignment)  # counted as live until the budget allows moving it
                    continue
                budget -= 1
            actions.append(Forget(assignment.replica_id, f"node {assignment.node_id} is lost"))
        elif assignment.status == ReplicaStatus.FAILED:
            actions.append(Stop(assignment.replica_id, assignment.node_id, assignment.detail or "failed"))
            actions.append(Forget(assignment.replica_id, f"failed on {assignment.node_id}: {assignment.detail}"))
        elif assignment.status == ReplicaStatus.STOPPED:
            actions.append(Forget(assignment.replica_id, "drained and stopped" if assignment.draining else "stopped"))
        else:
            kept.append(assignment)

    # Resources left on each node after what is already assigned there.
    free_ram = {n.node_id: n.ram_mib for n in node_map.values()}
    free_vram = {n.node_id: n.vram_mib for n in node_map.values()}
    ports: dict[str, set[int]] = {n.node_id: set() for n in node_map.values()}
    on_node: dict[str, list[Assignment]] = {n.node_id: [] for n in node_map.values()}
    for assignment in kept:
        if assignment.node_id in free_ram and assignment.status != ReplicaStatus.STOPPED:
            free_ram[assignment.node_id] -= assignment.holding.ram_mib
            free_vram[assignment.node_id] -= assignment.holding.vram_mib
            ports[assignment.node_id].add(assignment.port)
            on_node[assignment.node_id].append(assignment)
    gpu_free = {
        n.node_id: gpu_fit.free_per_gpu(n.gpus, ((a.devices, a.holding.vram_mib) for a in on_node[n.node_id]))
        for n in node_map.values()
        if n.gpus
    }

    # Live replicas per profile and per (profile, node), kept current as the pass places more, so
    # choosing a node does not rescan every assignment (1,000 nodes x 500 models in one pass).
    live_by_key: dict[str, list[Assignment]] = {}
    spread: dict[tuple[str, str], int] = {}
    for assignment in (a for a in kept if a.live):
        live_by_key.setdefault(assignment.profile_key, []).append(assignment)
        at = (assignment.profile_key, assignment.node_id)
        spread[at] = spread.get(at, 0) + 1
    ordered_nodes = sorted((n for n in node_map.values() if n.schedulable), key=lambda n: n.node_id)
    any_schedulable = bool(ordered_nodes)
    demand_list = sorted(demands, key=lambda d: (-d.waited, d.profile_key))
    min_replicas = {d.profile_key: d.min_replicas for d in demand_list}
    # Profiles a replica was evicted from in this pass: not placed again in it.
    evicted_keys: set[str] = set()
    for demand in demand_list:
        if demand.profile_key in evicted_keys:
            continue
        live = live_by_key.get(demand.profile_key, [])
        missing = demand.wanted - len(live)
        if missing < 0:
            # Drain the surplus: replicas not yet serving first, then the least recently used.
            surplus = sorted(live, key=lambda a: (a.status == ReplicaStatus.READY, a.last_used))[:-missing]
            actions.extend(Drain(a.replica_id, a.node_id) for a in surplus)
            for assignment in surplus:
                _now_draining(assignment, on_node, live_by_key)
            continue
        for _ in range(missing):
            if not any_schedulable:
                blocked[demand.profile_key] = "no node is connected and schedulable"
                break
            choice, reason, short = _choose_node(
                demand, ordered_nodes, spread, free_ram, free_vram, gpu_free, backoff, now
            )
            if choice is None:
                live_count = {k: len(v) for k, v in live_by_key.items()}
                room = make_room(
                    demand.profile_key,
                    {n.node_id: demand.claim_on(n.kind) for n in short},
                    free_ram,
                    free_vram,
                    on_node,
                    live_count,
                    min_replicas,
                    starved=demand.starved,
                    now=now,
                    min_age=limits.evict_min_age,
                )
                if room is not None and not _fits_gpus_after(room, demand, node_map[room.node_id], gpu_free):
                    room = None  # the totals would suffice, the node's GPUs one by one would not
                blocked[demand.profile_key] = reason if room is None else _making_room(room)
                if room is not None:
                    for victim in room.evict:
                        actions.append(Evict(victim.replica_id, victim.node_id, victim.profile_key, demand.profile_key))
                        evicted_keys.add(victim.profile_key)
                        _now_draining(victim, on_node, live_by_key)
                break
            claim = _claim_for(demand, node_map[choice])
            port = _free_port(node_map[choice], ports[choice], limits)
            if port is None:
                blocked[demand.profile_key] = f"node {choice}: no free port in {limits.port_min}-{limits.port_max}"
                break
            ports[choice].add(port)
            free_ram[choice] -= claim.ram_mib
            free_vram[choice] -= claim.vram_mib
            devices: tuple[int, ...] = ()
            if claim.vram_mib and choice in gpu_free and not node_map[choice].degraded:
                devices = gpu_fit.fit(gpu_free[choice], claim.vram_mib, demand.gpus) or ()
                for device in devices:
                    gpu_free[choice][device] -= gpu_fit.share(claim.vram_mib, len(devices))
            actions.append(Start(choice, demand.profile_key, port, claim, devices))
            spread[(demand.profile_key, choice)] = spread.get((demand.profile_key, choice), 0) + 1
    return Plan(actions, blocked, limits.reschedule_budget - budget)


def _claim_for(demand: Demand, node: PlanNode) -> Claim:
    """One replica's claim on ``node``; on a degraded node its VRAM claim is RAM (cpu_ok profiles
    only get there): the weights and the KV cache land in RAM instead."""
    claim = demand.claim_on(node.kind)
    if node.degraded and claim.vram_mib:
        return Claim(claim.ram_mib + claim.vram_mib, 0)
    return claim


def _now_draining(
    assignment: Assignment, on_node: dict[str, list[Assignment]], live_by_key: dict[str, list[Assignment]]
) -> None:
    """A drain decided in this pass: no longer live, and its memory is on its way out (what the
    room of a later demand may count on, and nothing to evict a second time)."""
    profile_key = assignment.profile_key
    live_by_key[profile_key] = [a for a in live_by_key.get(profile_key, []) if a is not assignment]
    held = on_node[assignment.node_id]
    held[held.index(assignment)] = attrs.evolve(assignment, draining=True)


def _fits_gpus_after(room: Room, demand: Demand, node: PlanNode, gpu_free: dict[str, dict[int, int]]) -> bool:
    """Whether the demand's VRAM fits on the node's GPUs once the room's replicas are gone."""
    claim = demand.claim_on(node.kind)
    free = gpu_free.get(node.node_id)
    if not claim.vram_mib or free is None:
        return True
    after = dict(free)
    for gone in (*room.evict, *room.draining):
        on = [d for d in gone.devices if d in after] or sorted(after)
        for device in on:
            after[device] += gpu_fit.share(gone.holding.vram_mib, len(on))
    return gpu_fit.fit(after, claim.vram_mib, demand.gpus) is not None


def _making_room(room: Room) -> str:
    if room.evict:
        names = ", ".join(f"{a.replica_id} ({a.profile_key})" for a in room.evict)
        return f"making room on node {room.node_id}: evicting idle {names}"
    names = ", ".join(a.replica_id for a in room.draining)
    return f"making room on node {room.node_id}: waiting for {names} to stop"


def _choose_node(
    demand: Demand,
    nodes: list[PlanNode],
    spread: dict[tuple[str, str], int],
    free_ram: dict[str, int],
    free_vram: dict[str, int],
    gpu_free: dict[str, dict[int, int]],
    backoff: dict[tuple[str, str], tuple[float, str]],
    now: float,
) -> tuple[str | None, str, list[PlanNode]]:
    """The best node for one more replica, or None, the reason nothing fits, and the nodes that
    would do but for their free memory (where eviction may make room)."""
    name, version = demand.engine
    reasons: list[str] = []
    candidates: list[PlanNode] = []
    short: list[PlanNode] = []
    required = demand.labels
    unconfigured = 0
    for node in nodes:
        if required and not _labels_match(required, node.labels):
            continue
        engine = node.engines.get(demand.engine)
        if engine is not None and EngineInstall(engine.status) is EngineInstall.UNCONFIGURED:
            # A node without vLLM (say) is not a node where vLLM failed: it is skipped silently.
            unconfigured += 1
            continue
        if engine is None or engine.status not in SERVES:
            words = engine.describe() if engine is not None else "engine not reported yet"
            reasons.append(f"node {node.node_id}: {name} {version}: {words}")
            continue
        built = engine.provenance.backend if engine.provenance is not None else ""
        if demand.backend and built != demand.backend:
            reasons.append(
                f"node {node.node_id}: {name} {version} is a {built or 'unknown'} build; the profile pins "
                f"backend {demand.backend}"
            )
            continue
        until = backoff.get((demand.profile_key, node.node_id))
        if until is not None and until[0] > now:
            reasons.append(f"start failed on node {node.node_id}: {until[1]} (retrying in {until[0] - now:.0f} s)")
            continue
        if node.degraded and demand.claim_on(node.kind).vram_mib and not demand.cpu_ok:
            reasons.append(
                f"node {node.node_id}: degraded, CPU only ({node.degraded}); this GPU profile does not say cpu_ok"
            )
            continue
        claim = _claim_for(demand, node)
        if free_ram[node.node_id] < claim.ram_mib or free_vram[node.node_id] < claim.vram_mib:
            reasons.append(
                f"node {node.node_id}: needs {claim.ram_mib} MiB RAM"
                + (f" and {claim.vram_mib} MiB VRAM" if claim.vram_mib else "")
                + f", has {max(free_ram[node.node_id], 0)} MiB free"
                + (f" and {max(free_vram[node.node_id], 0)} MiB VRAM" if claim.vram_mib else "")
            )
            short.append(node)
            continue
        on_gpus = gpu_free.get(node.node_id)
        if claim.vram_mib and on_gpus is not None and gpu_fit.fit(on_gpus, claim.vram_mib, demand.gpus) is None:
            each = gpu_fit.share(claim.vram_mib, demand.gpus)
            freest = max(on_gpus.values(), default=0)
            reasons.append(
                f"node {node.node_id}: needs {each} MiB VRAM on each of {demand.gpus} GPU(s), "
                f"the freest has {max(freest, 0)} MiB"
            )
            short.append(node)
            continue
        candidates.append(node)
    if not candidates:
        if not reasons and unconfigured:
            return None, f"no node has {name} configured (a node names it by path in its [[engines]])", short
        if not reasons:
            wanted = ", ".join(f"{k}={v}" for k, v in demand.labels.items())
            return None, f"no node has the labels {wanted}", short
        return None, "no node fits: " + "; ".join(reasons), short
    # Spread replicas of one profile across nodes, then prefer the hardware measured faster for
    # it (none measured: all alike), then the node with the most room.
    profile_key = demand.profile_key
    speed = demand.throughput_by_hardware
    best = min(
        candidates,
        key=lambda n: (spread.get((profile_key, n.node_id), 0), -speed.get(n.hardware, 0.0), -free_ram[n.node_id]),
    )
    return best.node_id, "", short
