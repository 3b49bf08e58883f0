"""The one loop that owns desired-versus-actual.

Each pass reads the node reports, computes how many replicas each profile wants (minimum,
requests waiting for it, idle time), asks the pure ``plan`` what to do, performs the actions
through a ``Dispatcher`` (which only queues commands: a pass never waits on the network), and
publishes the replicas that are ready to the gateway, withdrawing the ones that stopped being
ready before new requests reach them.

Replica ids and API keys are ``replica_ids.py``'s; the records of what runs where, the config and
the dispatcher interface are ``replica_records.py``'s.

What a node reports is the truth about its replicas: its hello lists every replica it has, so a
replica control placed there that the hello does not list is forgotten at once (and replaced if
it should run), whatever state control last saw it in.

This module is the loop and its pass, about 1,070 lines: the steps of one pass (absorb reports and
measurements, adopt, expire, demand, plan, apply, publish, tidy the nodes' weights) read and
change the same records in one order, and apart they would each need the whole reconciler passed
in. The decisions themselves are pure and elsewhere: ``plan`` (with ``eviction`` and ``gpus``),
``weights_gc``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import trio

from llmgw_shared import tracing
from llmgw_shared.logs import get_logger
from llmgw_shared.wire import (
    PORT_IN_USE,
    Command,
    DrainReplica,
    RemoveWeights,
    ReplicaSpec,
    ReplicaState,
    SetAdapters,
    StartReplica,
    StopReplica,
    WeightsSpec,
)

from ..catalog import Catalog, Claim, ProfileConfig, Resolved, replica_slots
from ..catalog.profile_key import ProfileKey
from ..gateway.adapters import replica_adapters
from ..gateway.demand import WaitingRequests
from ..gateway.replicas import Replica, ReplicaSet
from . import lifecycle
from .capacity import CapacityIndex, capacity_kind, hardware_of, profile_fingerprint
from .events import NodeEvents
from .inventory import Inventory, Liveness, NodeLiveness, NodeRecord
from .lifecycle import HOLDING, TERMINAL, ReplicaStatus
from .live_adapters import LiveAdapters, adapter_specs, lora_args
from .measured import MeasuredUse, node_kind
from .plan import Action, Demand, Drain, Evict, Forget, PlanLimits, PlanNode, Start, Stop, plan
from .replica_ids import ReplicaIds
from .replica_records import KEEP_ENDED, Dispatcher, EndedReplica, ReconcilerConfig, ReplicaRecord
from .token_bucket import TokenBucket
from .weights_gc import expired, room_for_download

log = get_logger(__name__)

# Seconds a forgotten replica must have been idle before its metric series are removed (see
# ``_sweep_retired``); one or two passes.
_SERIES_GRACE = 2.0
# Seconds between looks for model files a node keeps for nothing (``weights_keep_for`` is days
# long, and a removal sent is carried out by the node's next report: a minute is prompt enough).
_WEIGHTS_CHECK_INTERVAL = 60.0
# Bytes left free on a node's disk beyond a download, as the node keeps (llmgw_node.disk).
_NODE_DISK_MARGIN = 256 << 20


class Reconciler:
    def __init__(
        self,
        catalog: Catalog,
        inventory: Inventory,
        liveness: Liveness,
        dispatcher: Dispatcher,
        replicas: ReplicaSet,
        *,
        secret: bytes,
        claims: dict[str, Claim],
        config: ReconcilerConfig = ReconcilerConfig(),  # noqa: B008 -- frozen: one shared default is safe
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], float] = time.time,
        events: NodeEvents | None = None,
        on_replica_forgotten: Callable[[str], None] | None = None,
        demand: WaitingRequests | None = None,
    ) -> None:
        """``events``: what the agent service tells of the nodes; ``demand``: the activator's count of waiters."""
        self.catalog = catalog
        self.inventory = inventory
        self.liveness = liveness
        self.dispatcher = dispatcher
        self.replicas = replicas
        self.config = config
        self.claims = claims
        self.clock = clock
        self.wall_clock = wall_clock  # nodes report when weights were last used in Unix time
        self._weights_checked_at = float("-inf")
        self.ids = ReplicaIds(secret)
        self.records: dict[str, ReplicaRecord] = {}
        # Recently forgotten replicas, oldest first (bounded: replica_records.KEEP_ENDED).
        self.ended: dict[str, EndedReplica] = {}
        self.backoff: dict[tuple[str, str], tuple[float, str]] = {}
        self.failures: dict[tuple[str, str], int] = {}
        self.demand = demand if demand is not None else WaitingRequests()  # none given: a test's own
        self.blocked: dict[str, str] = {}
        # The leader lease's epoch, set by ``leadership`` when this daemon becomes the leader.
        self.fencing_token = 1
        # Until then (trio clock) a pass adopts and publishes but places nothing: set on taking
        # over, so nodes can report the engines they run before anything is started twice.
        self.hold_until = float("-inf")
        # Nodes that held replicas under the previous leader (from the store), when known: once
        # every one of them has said hello to this leader, the hold ends early (see leadership).
        self.awaited_nodes: frozenset[str] | None = None
        self._wake = trio.Event()
        self._reschedules = TokenBucket(config.reschedule_burst, config.reschedules_per_minute / 60)
        self._command_seq = 0
        self.passes = 0
        # Replicas this reconciler published (the set may also hold static replicas).
        self._published: set[str] = set()
        self._blocked_logged: dict[str, tuple[str, float]] = {}
        # Ports found taken by processes control does not know, per node.
        self.busy_ports: dict[str, set[int]] = {}
        # Per profile key: replica count -> when the load last needed that many (see _demands).
        self._load_marks: dict[str, dict[int, float]] = {}
        self._demands_at = float("-inf")
        # Nodes an operator cordoned (no new replicas there). Kept here rather than only on the
        # NodeRecord: a record is replaced when its node reconnects, and a cordon set before the
        # node ever connected (or restored from the store at start) must still hold.
        self.cordons: set[str] = set()
        # Told the id of each replica forgotten for good, once no request is in flight on it any
        # more, so per-replica metric series go with it (app.py: GatewayMetrics.forget_replica).
        self.on_replica_forgotten = on_replica_forgotten
        # Forgotten replicas whose series are still to be removed: id -> (its Replica if it was
        # published, when it was first seen idle).
        self._retired: dict[str, tuple[Replica | None, float | None]] = {}
        # The adapter lists sent to running vLLM replicas (fleet/live_adapters.py).
        self.live_adapters = LiveAdapters()
        # What replicas were measured to use, per (profile, node kind): the next claim there.
        self.measured = MeasuredUse()
        # Per profile key: since when requests have waited for it without a break (fairness).
        self._waiting_since: dict[str, float] = {}
        # Replicas evicted per profile key, for ``llmgw_fleet_evictions_total``.
        self.evictions: dict[str, int] = {}
        # Finished capacity runs (fleet/capacity.py): a replica's slots, placement's preference.
        self.capacity = CapacityIndex()
        # Replicas a capacity run is measuring: busy, so never evicted from under the run.
        self.benchmarking: set[str] = set()
        if events is not None:
            events.listen(self)

    # ------------------------------------------------------------------ outside API

    def wake(self) -> None:
        self._wake.set()

    def replica_api_key(self, replica_id: str) -> str:
        return self.ids.api_key(replica_id)

    def new_replica_id(self, profile_key: str, node_id: str) -> str:
        return self.ids.new(profile_key, node_id)

    def adoption_key(self, replica_id: str, node_id: str) -> str | None:
        """The profile key control minted ``replica_id`` for on ``node_id``; None when it did not."""
        return self.ids.minted_for(replica_id, node_id, [r.profile_key for r in self.catalog.all_profiles()])

    def status(self, profile_key: str) -> str:
        """Why ``profile_key`` has no ready replica, in the operator's words."""
        if profile_key in self.blocked:
            return self.blocked[profile_key]
        starting = [r for r in self.records.values() if r.profile_key == profile_key and not r.draining]
        if starting:
            record = starting[0]
            words = f"{record.status}: {record.detail}" if record.detail else record.status
            return f"replica {record.replica_id} on node {record.node_id} is {words}"
        return "no replica placed yet"

    def mark_failed(self, replica_id: str, detail: str) -> None:
        """A start failed (the node said so, or a deadline passed): back off from that node for
        this model, then retry. A replica already stopped or failed stays as it is."""
        record = self.records.get(replica_id)
        if record is None or record.status in TERMINAL:
            return
        record.move(ReplicaStatus.FAILED, detail)
        if PORT_IN_USE in detail:
            # Something else on that node holds the port: not the model's fault. Avoid the port
            # there and place again at once, instead of backing the model off the whole node.
            self.busy_ports.setdefault(record.node_id, set()).add(record.port)
            log.warning(
                "port %d on node %s is taken by another process: choosing another",
                record.port,
                record.node_id,
                extra={"model": record.profile_key},
            )
            self.wake()
            return
        attempts = self.failures.get((record.profile_key, record.node_id), 0) + 1
        self.failures[(record.profile_key, record.node_id)] = attempts
        delay = min(self.config.backoff_cap, self.config.backoff_base * 2 ** (attempts - 1))
        self.backoff[(record.profile_key, record.node_id)] = (self.clock() + delay, detail or "failed")
        # With the engine's last words: "exited with status 1" alone sends the operator to the node.
        log.warning(
            "replica %s of %s failed on node %s: %s (not retried there for %.0f s)",
            replica_id,
            record.profile_key,
            record.node_id,
            detail,
            delay,
            extra={"model": record.profile_key, "engine_output": record.last_lines[-5:]},
        )
        self.wake()

    def is_cordoned(self, node_id: str) -> bool:
        node = self.inventory.get(node_id)
        return node_id in self.cordons or (node is not None and node.cordoned)

    def cordon(self, node_id: str) -> None:
        """No new replicas on this node; the ones it runs keep serving."""
        self.cordons.add(node_id)
        node = self.inventory.get(node_id)
        if node is not None:
            node.cordoned = True
        self.wake()

    def uncordon(self, node_id: str) -> None:
        self.cordons.discard(node_id)
        node = self.inventory.get(node_id)
        if node is not None:
            node.cordoned = False
        self.wake()

    def drain_node(self, node_id: str) -> list[str]:
        """Cordon the node and drain every replica on it (withdrawn from the gateway first);
        the next pass places replacements elsewhere. Returns the replica ids drained."""
        self.cordon(node_id)
        return self._drain([r for r in self.records.values() if r.node_id == node_id])

    def drain_profile_key(self, profile_key: str) -> list[str]:
        """Drain every replica of a profile key (its model was removed, or changed so that the
        running engines no longer match it)."""
        self.measured.forget(profile_key)
        return self._drain([r for r in self.records.values() if r.profile_key == profile_key])

    def start_on(self, profile_key: str, node_id: str) -> str:
        """Place one more replica of ``profile_key`` on ``node_id`` now (a capacity run asked for that
        node): the pure ``plan`` decides whether it fits there, as for any start. Returns the new
        replica id; ValueError with the reason when it cannot start there."""
        resolved = self.catalog.resolve(profile_key)
        if resolved is None:
            raise ValueError(f"no model {profile_key}")
        live = [
            r
            for r in self.records.values()
            if r.profile_key == profile_key and not r.draining and r.status not in TERMINAL
        ]
        if len(live) >= resolved.profile.max_replicas:
            # One more would be drained again by the next pass as a surplus.
            raise ValueError(
                f"{profile_key} runs its max_replicas ({resolved.profile.max_replicas}) already, none on "
                f"node {node_id}: measure one of those (on its node)"
            )
        now = self.clock()
        views = [v for v in self._node_views(now) if v.node_id == node_id]
        if not views:
            raise ValueError(f"node {node_id} is not connected")
        here = [r.as_assignment(r.created_at) for r in self.records.values() if r.node_id == node_id]
        demand = self._demand(resolved, sum(1 for a in here if a.profile_key == profile_key and a.live) + 1)
        decided = plan(
            [demand],
            views,
            here,
            backoff=self.backoff,
            now=now,
            limits=PlanLimits(self.config.port_min, self.config.port_max),
        )
        starts: list[Action] = [a for a in decided.actions if isinstance(a, Start)]
        if not starts:
            raise ValueError(decided.blocked.get(profile_key, f"{profile_key} cannot start on node {node_id}"))
        before = set(self.records)
        self._apply(starts[:1], now)
        started = set(self.records) - before
        if not started:
            raise ValueError(f"the start command could not be sent to node {node_id}")
        return started.pop()

    def give_back_started(self, replica_id: str) -> bool:
        """A capacity run is done with the replica it had started: drain it, unless requests are
        on it or the profile's ``min_replicas`` needs it (then it stays, to its idle timeout)."""
        self.benchmarking.discard(replica_id)
        record = self.records.get(replica_id)
        if record is None or record.draining:
            return False
        resolved = self.catalog.resolve(record.profile_key)
        replica = self.replicas.get(replica_id)
        live = [
            r
            for r in self.records.values()
            if r.profile_key == record.profile_key and not r.draining and r.status not in TERMINAL
        ]
        if (
            (replica is not None and replica.in_flight)
            or self.demand.waiting(record.profile_key)
            or (resolved is not None and len(live) <= resolved.profile.min_replicas)
        ):
            return False
        return bool(self._drain([record]))

    def command_failed(self, node_id: str, command: Command, reason: str) -> None:
        """The node refused a command, or did not acknowledge it in time (``reason`` says which)."""
        if isinstance(command, StartReplica):
            record = self.records.get(command.replica.replica_id)
            if record is not None and record.node_id == node_id:
                self.mark_failed(record.replica_id, reason)

    def command_unsent(self, node_id: str, command: Command) -> None:
        """A command that did not leave control, or was being written when its node's connection
        ended (the agent service cannot tell whether that one arrived).

        A start is forgotten now, so a replacement is placed without waiting for the node to come
        back or be lost; had it arrived after all, the node's next hello lists the replica and it is
        adopted (the plan drains a surplus). A drain is sent again when the node's next hello
        still lists the replica (``_settle_full_report``).
        """
        if isinstance(command, StartReplica):
            record = self.records.get(command.replica.replica_id)
            if record is not None and record.node_id == node_id and record.status == ReplicaStatus.ASSIGNED:
                self._forget(Forget(record.replica_id, f"its start never reached node {node_id}"), self.clock())
                self.wake()

    def holders(self) -> frozenset[str]:
        """Nodes running (or starting) replicas this control placed or adopted."""
        return frozenset(r.node_id for r in self.records.values() if r.status in HOLDING)

    def _drain(self, records: list[ReplicaRecord]) -> list[str]:
        drained = [r.replica_id for r in records if not r.draining and r.status not in TERMINAL]
        if drained:
            self._apply([Drain(replica_id, self.records[replica_id].node_id) for replica_id in drained], self.clock())
            self.wake()
        return drained

    def stand_down(self) -> None:
        """This daemon stopped leading: forget the fleet, as a restarted control would.

        Every replica it published is withdrawn (a standby routes nothing), and what runs where is
        learnt again from the nodes' hellos, with adoption, if it leads again.
        """
        for replica_id in list(self.records) + list(self._published):
            self.replicas.withdraw(replica_id)
        self.records.clear()
        self.backoff.clear()
        self.failures.clear()
        self.blocked = {}
        self._published = set()
        self.awaited_nodes = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            self._wake = trio.Event()
            try:
                # A span per pass (llmgw_shared/tracing.py): its placements are events, the node
                # commands it sends its children (fleet/agents.py).
                with tracing.span("llmgw.reconcile", {"llmgw.pass": self.passes + 1}):
                    self.reconcile_once()
            except Exception:
                # A bug in one pass must not stop the fleet from being managed.
                log.exception("reconcile pass failed")
            with trio.move_on_after(self.config.interval):
                await self._wake.wait()

    # ------------------------------------------------------------------ one pass

    def reconcile_once(self) -> None:
        now = self.clock()
        self.passes += 1
        self._absorb_reports(now)
        self._expire_assigned(now)
        self._forget_lost_nodes(now)
        self._sweep_retired(now)
        if now < self.hold_until and self._awaited_have_reported():
            log.info("every node that held replicas before has reported: placing now")
            self.hold_until = now
        if now < self.hold_until:
            self._publish_to_gateway(now)
            return
        # Replicas of a model the catalog no longer has (removed through the admin API) go away
        # the usual way: withdrawn, then drained.
        self._drain([r for r in self.records.values() if self.catalog.resolve(r.profile_key) is None])
        demands = self._demands(now)
        views = self._node_views(now)
        limits = PlanLimits(
            self.config.port_min, self.config.port_max, self._reschedules.available(now), self.config.evict_min_age
        )
        published = {r.id: r for r in self.replicas}
        assignments = []
        for record in self.records.values():
            replica = published.get(record.replica_id)
            busy = (
                bool(self.demand.waiting(record.profile_key))
                or (replica is not None and replica.in_flight > 0)
                or record.replica_id in self.benchmarking
            )
            last_used = replica.last_used if replica is not None else record.created_at
            assignments.append(record.as_assignment(last_used, busy=busy))
        decided = plan(demands, views, assignments, backoff=self.backoff, now=now, limits=limits)
        self._reschedules.spend(decided.rescheduled, now)
        self._apply(decided.actions, now)
        for profile_key, reason in decided.blocked.items():
            self._log_blocked(profile_key, reason, now)
        self.blocked = decided.blocked
        self._sync_adapters()
        self._publish_to_gateway(now)
        if now - self._weights_checked_at >= _WEIGHTS_CHECK_INTERVAL:
            self._weights_checked_at = now
            self._remove_unused_weights()

    # ------------------------------------------------------------------ weights on nodes

    def weights_in_use(self, node_id: str) -> dict[str, list[str]]:
        """sha256 -> the profile keys of control's replicas on the node that use the file."""
        out: dict[str, list[str]] = {}
        for record in self.records.values():
            if record.node_id == node_id and record.status in HOLDING:
                resolved = self.catalog.resolve(record.profile_key)
                # A vLLM or SGLang replica serves a model directory, not a file of the cache.
                if resolved is not None and resolved.profile.weights is not None:
                    out.setdefault(resolved.profile.weights.sha256.lower(), []).append(record.profile_key)
                    # Its LoRA adapters are files of the cache too, kept and collected alike.
                    for adapter in resolved.profile.adapters:
                        out.setdefault(adapter.weights.sha256.lower(), []).append(record.profile_key)
        return out

    def _remove_unused_weights(self) -> None:
        now = self.wall_clock()
        for node in self.inventory:
            if not node.connected or not node.weights:
                continue
            stale = expired(
                node.weights, set(self.weights_in_use(node.node_id)), now=now, keep_for=self.config.weights_keep_for
            )
            if stale:
                log.info(
                    "removing %d model file(s) unused for %.0f s from node %s: %s",
                    len(stale),
                    self.config.weights_keep_for,
                    node.node_id,
                    ", ".join(s[:12] for s in stale),
                    extra={"node": node.node_id},
                )
                self._send(node.node_id, RemoveWeights(self._next_id(), self.fencing_token, stale))

    def _room_for_weights(self, node: NodeRecord, resolved: Resolved) -> None:
        """Before a start whose weights the node lacks: the least recently used unused files go
        when the download would not fit (the removal is sent first; a node handles commands in order)."""
        weights = resolved.profile.weights
        if weights is None or node.weights is None or weights.url.startswith(("/", "file://")):
            return
        if any(w.sha256 == weights.sha256.lower() for w in node.weights):
            return
        free = node.facts.disk_free_mib * (1 << 20) - _NODE_DISK_MARGIN
        victims = room_for_download(node.weights, set(self.weights_in_use(node.node_id)), need=weights.size, free=free)
        if victims:
            log.info(
                "removing %d least recently used model file(s) from node %s to make room for %s",
                len(victims),
                node.node_id,
                resolved.profile_key,
                extra={"node": node.node_id},
            )
            self._send(node.node_id, RemoveWeights(self._next_id(), self.fencing_token, victims))
            gone = set(victims)
            node.weights = [w for w in node.weights if w.sha256 not in gone]

    def would_fit(self, claim: Claim, engine: tuple[str, str], labels: dict[str, str] | None = None) -> str:
        """Whether one replica with ``claim`` would be placed on some node now, by the same plan
        placement runs, beside what is assigned: "" when it fits, else plan's reason."""
        now = self.clock()
        probe = "\x00probe"  # a profile key no profile can have (names never hold NUL)
        last_used = {r.id: r.last_used for r in self.replicas}
        decided = plan(
            [Demand(probe, engine, claim, 1, dict(labels or {}))],
            self._node_views(now),
            [r.as_assignment(last_used.get(r.replica_id, r.created_at)) for r in self.records.values()],
            backoff={},
            now=now,
            limits=PlanLimits(self.config.port_min, self.config.port_max, 0),
        )
        if any(isinstance(a, Start) and a.profile_key == probe for a in decided.actions):
            return ""
        return decided.blocked.get(probe, "no node is ready")

    def _log_blocked(self, profile_key: str, reason: str, now: float) -> None:
        """Say why a model waits, in the node's words, without a line for every percent of a download."""
        gist = re.sub(r"[0-9.]+", "#", reason)
        last_gist, last_time = self._blocked_logged.get(profile_key, ("", -1e9))
        if gist != last_gist or now - last_time >= 10:
            self._blocked_logged[profile_key] = (gist, now)
            log.info("model %s waits: %s", profile_key, reason, extra={"model": profile_key})

    def _absorb_reports(self, now: float) -> None:
        for node in self.inventory:
            if node.full_report_pending:
                node.full_report_pending = False
                self._settle_full_report(node, now)
            for state in list(node.replicas.values()):
                record = self.records.get(state.replica_id)
                if record is None:
                    self._adopt(node, state, now)
                elif record.node_id == node.node_id:
                    self._absorb(node, record, state, now)

    def _settle_full_report(self, node: NodeRecord, now: float) -> None:
        """The node's hello listed every replica it has: what it did not list is gone.

        Runs in the first pass after the hello, before this pass can start anything there, so
        every record on the node predates the report. A replica the node no longer has (it was
        restarted without its engines, the start was lost with a connection, the download died
        with the node) is withdrawn and forgotten; the plan then places it again if it should run.
        A drain the node has not carried out (it may have been lost with the connection) is sent
        again; drains are idempotent on the node.
        """
        for record in [r for r in self.records.values() if r.node_id == node.node_id]:
            state = node.replicas.get(record.replica_id)
            if state is None:
                self._forget(Forget(record.replica_id, f"node {node.node_id} no longer has it (not in its hello)"), now)
            elif record.draining and state.status not in TERMINAL:
                log.info("sending the drain of replica %s to node %s again", record.replica_id, node.node_id)
                self._send(node.node_id, DrainReplica(self._next_id(), self.fencing_token, record.replica_id))

    def _absorb(self, node: NodeRecord, record: ReplicaRecord, state: ReplicaState, now: float) -> None:
        """Apply what the node says about a replica control knows, if it can be true."""
        reported = ReplicaStatus(state.status)
        if record.status in TERMINAL:
            return  # control has decided: the plan stops and forgets it
        if record.draining and reported not in TERMINAL:
            # The drain is on its way (or being carried out): an older "ready" must not undo it.
            if reported == ReplicaStatus.DRAINING:
                record.detail = state.detail
            return
        if not lifecycle.allowed(record.status, reported):
            log.warning(
                "node %s reported replica %s going from %s to %s, which cannot happen: ignored",
                node.node_id,
                record.replica_id,
                record.status,
                reported,
                extra={"node": node.node_id},
            )
            return
        if reported == ReplicaStatus.READY and record.status != ReplicaStatus.READY:
            record.ready_since = now
            self.failures.pop((record.profile_key, record.node_id), None)
            log.info("replica %s of %s ready on node %s", record.replica_id, record.profile_key, node.node_id)
        if state.last_lines:
            record.last_lines = list(state.last_lines)
        record.adapters = tuple(state.adapters)
        if reported == ReplicaStatus.FAILED:
            self.mark_failed(record.replica_id, state.detail)
        else:
            record.move(reported, state.detail)
            self._measured(node, record, state)

    def _measured(self, node: NodeRecord, record: ReplicaRecord, state: ReplicaState) -> None:
        """Take the node's measurement of a running replica: its accounting, and the next claim."""
        if state.rss_mib == 0 and state.vram_mib == 0:
            return  # not measured yet (or between restarts): the claim stands
        used = Claim(state.rss_mib, state.vram_mib)
        resolved = self.catalog.resolve(record.profile_key)
        if resolved is not None and resolved.profile.ram_mib:
            # A claim the operator configured is a reservation, not a guess: what is measured
            # may raise it, never lower it (it may cover a peak the measurement has not seen).
            configured = Claim(resolved.profile.ram_mib, resolved.profile.vram_mib)
            used = Claim(max(used.ram_mib, configured.ram_mib), max(used.vram_mib, configured.vram_mib))
        record.used = used
        if record.status == ReplicaStatus.READY:
            # Only a replica that loaded says what the profile needs; one still loading holds less.
            self.measured.record(record.profile_key, node_kind(node.facts), record.used)

    def _adopt(self, node: NodeRecord, state: ReplicaState, now: float) -> None:
        """A replica a node runs that this control does not know: after a restart, take it over --
        but only one control minted for this node, at the node's own address, on a port control
        could have given it. Anything else the node is told to stop."""
        status = ReplicaStatus(state.status)
        if status in TERMINAL or status == ReplicaStatus.DRAINING:
            return  # ended, or on its way out: nothing to take over
        replica_id = state.replica_id
        profile_key = self.adoption_key(replica_id, node.node_id)
        refusal = ""
        if profile_key is None:
            refusal = "no model in the catalog claims it, or it was not started on this node"
        elif not self.config.port_min <= state.port <= self.config.port_max:
            refusal = f"port {state.port} is outside {self.config.port_min}-{self.config.port_max}"
        elif any(
            r.node_id == node.node_id and r.port == state.port and r.status in HOLDING for r in self.records.values()
        ):
            refusal = f"port {state.port} belongs to another replica there"
        if refusal or profile_key is None:
            log.info(
                "node %s runs replica %s, which is not adopted (%s): stopping it",
                node.node_id,
                replica_id,
                refusal,
                extra={"node": node.node_id},
            )
            self._send(node.node_id, StopReplica(self._next_id(), self.fencing_token, replica_id))
            node.replicas.pop(replica_id, None)
            return
        record = ReplicaRecord(
            replica_id,
            profile_key,
            node.node_id,
            state.port,
            self.claims.get(profile_key, Claim(0)),
            status,
            state.detail,
            created_at=now,
            ready_since=now if status == ReplicaStatus.READY else None,
            address=node.address,
            adapters=tuple(state.adapters),
        )
        self.records[replica_id] = record
        self._measured(node, record, state)
        log.info("adopted replica %s of %s on node %s (%s)", replica_id, profile_key, node.node_id, status)

    def _expire_assigned(self, now: float) -> None:
        """A start the node acknowledged (or never answered) and then never reported: failed."""
        limit = self.config.assigned_timeout
        for record in list(self.records.values()):
            if record.status == ReplicaStatus.ASSIGNED and now - record.created_at > limit:
                node = self.inventory.get(record.node_id)
                # A node that went quiet is the liveness rules' business, not this deadline's.
                if node is not None and self.liveness.state(node, now) == NodeLiveness.READY:
                    self.mark_failed(
                        record.replica_id,
                        f"node {record.node_id} did not report it within {limit:g} s of being told to start it",
                    )

    def _forget_lost_nodes(self, now: float) -> None:
        """Nodes silent past ``forget_nodes_after`` are dropped, with whatever control kept on them."""
        retention = max(self.config.forget_nodes_after, self.liveness.lost_after)
        for node in self.inventory:
            if node.connected or now - node.last_seen <= retention:
                continue
            for record in [r for r in self.records.values() if r.node_id == node.node_id]:
                self._forget(Forget(record.replica_id, f"node {node.node_id} is forgotten"), now)
            self.inventory.remove(node.node_id)
            self.busy_ports.pop(node.node_id, None)
            for at in [k for k in self.backoff if k[1] == node.node_id]:
                del self.backoff[at]
            for at in [k for k in self.failures if k[1] == node.node_id]:
                del self.failures[at]
            log.info(
                "forgot node %s: silent for %.0f s", node.node_id, now - node.last_seen, extra={"node": node.node_id}
            )

    def _awaited_have_reported(self) -> bool:
        awaited = self.awaited_nodes
        if awaited is None:
            return False
        for node_id in awaited:
            node = self.inventory.get(node_id)
            if node is None or not node.connected:
                return False
        return True

    def _demands(self, now: float) -> list[Demand]:
        """How many replicas each profile wants now: the demand the gateway's queue and slots show.

        - At least ``min_replicas``; one as soon as a request waits for a model with none.
        - One more (up to ``max_replicas``) when every slot of every replica is busy and requests
          queue for them, or when every slot stays busy for ``saturated_after`` with none queued;
          only while no replica of the profile is still starting, so a burst adds one replica at
          a time rather than all at once before the first is up.
        - Surplus replicas go after ``idle_timeout``: a replica is kept while the load of the
          last ``idle_timeout`` seconds (requests holding a slot or queued, sampled each pass)
          needed it, and for ``idle_timeout`` after it became ready. Load, not per-replica
          idleness, because the balancer spreads requests over every replica: with any traffic
          at all none of them is ever idle.
        """
        demands = []
        live_by_key: dict[str, list[ReplicaRecord]] = {}
        for record in self.records.values():
            if not record.draining and record.status not in TERMINAL:
                live_by_key.setdefault(record.profile_key, []).append(record)
        marks_seen: set[str] = set()
        waiting_now = self.demand.snapshot()
        for profile_key in [k for k in self._waiting_since if k not in waiting_now]:
            del self._waiting_since[profile_key]
        for profile_key in waiting_now:
            self._waiting_since.setdefault(profile_key, now)
        for resolved in self.catalog.all_profiles():
            profile_key = resolved.profile_key
            profile = resolved.profile
            marks_seen.add(profile_key)
            live = live_by_key.get(profile_key, [])
            published = {r.id: r for r in self.replicas.for_model(profile_key)}
            serving = [published[r.replica_id] for r in live if r.replica_id in published]
            waiting = waiting_now.get(profile_key, 0)
            marks = self._load_marks.setdefault(profile_key, {})
            # Requests in the gateway for this profile now; a replica used since the last pass
            # counts as one, so requests shorter than a pass are load too.
            load = waiting + sum(r.in_flight or (1 if r.last_used > self._demands_at else 0) for r in serving)
            for count in range(1, -(-load // replica_slots(profile)) + 1):
                marks[count] = now
            if profile.idle_timeout == 0:
                keep = len(live)
            else:
                recent = max((n for n, at in marks.items() if now - at < profile.idle_timeout), default=0)
                starting_or_new = sum(
                    1
                    for r in live
                    if r.replica_id not in published or now - (r.ready_since or r.created_at) < profile.idle_timeout
                )
                keep = min(len(live), max(recent, starting_or_new))
            wanted = max(profile.min_replicas, keep, 1 if waiting else 0)
            if serving and len(serving) == len(live) and all(r.in_flight >= r.slots for r in serving):
                full_since = max(r.full_since if r.full_since is not None else now for r in serving)
                if waiting or now - full_since >= self.config.saturated_after:
                    wanted = len(live) + 1
                    marks[wanted] = now
            wanted = min(wanted, profile.max_replicas)
            waited = now - self._waiting_since.get(profile_key, now)
            demands.append(
                self._demand(resolved, wanted, starved=waiting > 0 and waited >= self.config.yield_after, waited=waited)
            )
        for profile_key in set(self._load_marks) - marks_seen:
            del self._load_marks[profile_key]
        self._demands_at = now
        return demands

    def _demand(self, resolved: Resolved, wanted: int, *, starved: bool = False, waited: float = 0.0) -> Demand:
        profile = resolved.profile
        engine = (profile.engine, self.catalog.engine_version(profile))
        # No run learnt (the usual case): nothing to look up, placement as without measurements.
        profile_key = resolved.profile_key
        throughput = (
            self.capacity.throughput(
                profile_key, *engine, profile_fingerprint(profile), profile.ttft_target, profile.itl_target
            )
            if self.capacity
            else {}
        )
        return Demand(
            profile_key,
            engine,
            self.claims.get(profile_key, Claim(0)),
            wanted,
            dict(profile.labels),
            min_replicas=profile.min_replicas,
            starved=starved,
            claim_by_kind=self.measured.by_kind(profile_key),
            gpus=profile.gpus,
            waited=waited,
            throughput_by_hardware=throughput,
            cpu_ok=profile.cpu_ok,
            backend=profile.backend,
        )

    def replica_slots_on(self, profile_key: str, profile: ProfileConfig, node: NodeRecord | None) -> int:
        """A replica's slots: what a capacity run measured on its node's kind, else ``parallel``."""
        if node is not None and self.capacity:
            kind = capacity_kind(hardware_of(node.facts), profile.engine, self.catalog.engine_version(profile))
            measured = self.capacity.slots(
                profile_key, kind, profile_fingerprint(profile), profile.ttft_target, profile.itl_target
            )
            if measured is not None:
                return measured
        return replica_slots(profile)

    def _node_views(self, now: float) -> list[PlanNode]:
        views = []
        for node in self.inventory:
            facts = node.facts
            busy_ports = frozenset(
                {s.port for s in node.replicas.values() if s.status not in TERMINAL}
                | self.busy_ports.get(node.node_id, set())
            )
            views.append(
                PlanNode(
                    node.node_id,
                    self.liveness.state(node, now),
                    self.is_cordoned(node.node_id),
                    node.labels,
                    dict(node.engines),
                    max(0, facts.ram_total_mib - self.config.reserved_ram_mib),
                    sum(g.memory_total_mib for g in facts.gpus),
                    busy_ports,
                    node_kind(facts),
                    tuple((g.index, g.memory_total_mib) for g in facts.gpus),
                    hardware_of(facts),
                    facts.degraded,
                )
            )
        return views

    def _apply(self, actions: list[Action], now: float) -> None:
        for action in actions:
            if not isinstance(action, Start):  # a start's event waits for its replica id (_start)
                self._placement_event(action)
            if isinstance(action, Start):
                self._start(action, now)
            elif isinstance(action, Drain | Evict):
                record = self.records.get(action.replica_id)
                if record is None:
                    continue
                # Withdraw before draining so no new request is sent to a replica going away.
                self.replicas.withdraw(record.replica_id)
                record.draining = True
                record.move(ReplicaStatus.DRAINING)
                if isinstance(action, Evict):
                    # Back to scale from zero: the load that kept it is forgotten, so only new
                    # requests (waiting for it) place it again.
                    self._load_marks.pop(record.profile_key, None)
                    self.evictions[record.profile_key] = self.evictions.get(record.profile_key, 0) + 1
                    log.info(
                        "evicting replica %s of %s on node %s to make room for %s",
                        record.replica_id,
                        record.profile_key,
                        record.node_id,
                        action.for_profile_key,
                        extra={"model": record.profile_key},
                    )
                else:
                    log.info(
                        "draining replica %s of %s on node %s", record.replica_id, record.profile_key, record.node_id
                    )
                self._send(record.node_id, DrainReplica(self._next_id(), self.fencing_token, record.replica_id))
            elif isinstance(action, Stop):
                self._send(action.node_id, StopReplica(self._next_id(), self.fencing_token, action.replica_id))
            else:
                self._forget(action, now)

    def _placement_event(self, action: Drain | Evict | Stop | Forget) -> None:
        """What placement decided about a replica, as an event on the pass's span (tracing on)."""
        record = self.records.get(action.replica_id)
        profile_key = record.profile_key if record is not None else getattr(action, "profile_key", "")
        tracing.event(
            "llmgw.placement",
            {
                "llmgw.action": type(action).__name__.lower(),
                "llmgw.node": record.node_id if record else "",
                "gen_ai.request.model": ProfileKey.model_of(profile_key),
                "llmgw.profile": profile_key,
                "llmgw.replica": action.replica_id,
            },
        )

    def _start(self, action: Start, now: float) -> None:
        resolved = self.catalog.resolve(action.profile_key)
        if resolved is None:
            return
        node = self.inventory.get(action.node_id)
        if node is None:
            return
        replica_id = self.new_replica_id(action.profile_key, action.node_id)
        tracing.event(
            "llmgw.placement",
            {
                "llmgw.action": "start",
                "llmgw.node": action.node_id,
                "gen_ai.request.model": resolved.model.name,
                "llmgw.profile": action.profile_key,
                "llmgw.replica": replica_id,
            },
        )
        spec = self.replica_spec(resolved, replica_id, action.port, action.devices)
        self._room_for_weights(node, resolved)
        # The record first: a dispatcher may report the command lost before send returns.
        self.records[replica_id] = ReplicaRecord(
            replica_id,
            action.profile_key,
            action.node_id,
            action.port,
            action.claim,
            created_at=now,
            address=node.address,
            devices=action.devices,
        )
        if not self._send(action.node_id, StartReplica(self._next_id(), self.fencing_token, spec)):
            self.records.pop(replica_id, None)
            return
        self.live_adapters.sent_to(replica_id, spec.adapters)  # what it loads once ready
        log.info(
            "starting replica %s of %s on node %s port %d", replica_id, action.profile_key, action.node_id, action.port
        )

    def replica_spec(
        self, resolved: Resolved, replica_id: str, port: int, devices: tuple[int, ...] = ()
    ) -> ReplicaSpec:
        profile = resolved.profile
        args = list(profile.args)
        if profile.engine == "llama.cpp":
            # llama-server splits -c across its -np slots; the profile's context is per request.
            args = [
                "-c",
                str(profile.context * profile.parallel),
                "-np",
                str(profile.parallel),
                "--alias",
                resolved.model.name,
                "--metrics",
                *args,
            ]
        elif profile.engine == "vllm":
            # The name the gateway sends; the context per request; sequences batched at once.
            args = [
                "--served-model-name",
                resolved.model.name,
                "--max-model-len",
                str(profile.context),
                "--max-num-seqs",
                str(replica_slots(profile)),
                *lora_args(profile),
                *args,
            ]
        elif profile.engine == "sglang":
            args = [
                "--served-model-name",
                resolved.model.name,
                "--context-length",
                str(profile.context),
                "--max-running-requests",
                str(replica_slots(profile)),
                "--enable-metrics",
                *args,
            ]
        weights = profile.weights
        return ReplicaSpec(
            replica_id=replica_id,
            engine=profile.engine,
            engine_version=self.catalog.engine_version(profile),
            weights=WeightsSpec(weights.url, weights.sha256, weights.size) if weights is not None else None,
            port=port,
            api_key=self.replica_api_key(replica_id),
            args=args,
            env=dict(profile.env),
            start_timeout_s=profile.start_timeout,
            model_dir=profile.model_dir,
            devices=list(devices),
            adapters=adapter_specs(profile),
        )

    def _forget(self, action: Forget, now: float) -> None:
        record = self.records.pop(action.replica_id, None)
        replica = self.replicas.withdraw(action.replica_id)
        if record is None:
            return
        self._retired[record.replica_id] = (replica, None)
        self.ended[record.replica_id] = EndedReplica(
            record.replica_id, record.profile_key, record.node_id, record.status, record.detail, record.last_lines
        )
        while len(self.ended) > KEEP_ENDED:
            del self.ended[next(iter(self.ended))]
        node = self.inventory.get(record.node_id)
        if node is not None:
            node.replicas.pop(record.replica_id, None)
        log.info("forgetting replica %s of %s: %s", record.replica_id, record.profile_key, action.reason)

    def _sync_adapters(self) -> None:
        """Send running vLLM replicas their profile's adapters where the catalog changed them."""
        for record, adapters in self.live_adapters.due(self.records.values(), self.catalog):
            log.info(
                "replica %s of %s: loading adapters [%s] live",
                record.replica_id,
                record.profile_key,
                ", ".join(a.name for a in adapters),
            )
            if self._send(
                record.node_id, SetAdapters(self._next_id(), self.fencing_token, record.replica_id, adapters)
            ):
                self.live_adapters.sent_to(record.replica_id, adapters)

    def _publish_to_gateway(self, now: float) -> None:
        for record in self.records.values():
            node = self.inventory.get(record.node_id)
            state = self.liveness.state(node, now) if node is not None else NodeLiveness.LOST
            routable = (
                record.status == ReplicaStatus.READY
                and not record.draining
                and state in (NodeLiveness.READY, NodeLiveness.DISCONNECTED)
            )
            current = self.replicas.get(record.replica_id)
            if routable and node is not None:
                url = f"http://{_url_host(record.address or node.address)}:{record.port}"
                resolved = self.catalog.resolve(record.profile_key)
                slots = self.replica_slots_on(record.profile_key, resolved.profile, node) if resolved else 1
                adapters, adapter_mode = replica_adapters(resolved.profile, record.adapters) if resolved else ((), "")
                if current is None or current.url != url:
                    served = resolved.model.name if resolved else ""
                    # llama-server started with -np parallel (_engine_args): its slots can be named.
                    engine_slots = (
                        resolved.profile.parallel
                        if resolved is not None and resolved.profile.engine == "llama.cpp"
                        else 0
                    )
                    self.replicas.publish(
                        Replica(
                            id=record.replica_id,
                            url=url,
                            models=frozenset({record.profile_key}),
                            slots=slots,
                            api_key=self.replica_api_key(record.replica_id),
                            served_name=served,
                            last_used=now,
                            engine_slots=engine_slots,
                            adapters=adapters,
                            adapter_mode=adapter_mode,
                        )
                    )
                elif current.adapters != adapters:
                    # Renamed or rescaled (a changed llama.cpp list drains the replica instead), or
                    # loaded into or out of a live vLLM: requests name them as the catalog now does.
                    current.adapters = adapters
                elif current.slots != slots:
                    # A capacity run finished (or the profile changed): the replica's counters
                    # stay, only its bound moves; requests waiting take slots that opened.
                    log.info("replica %s of %s now has %d slots", record.replica_id, record.profile_key, slots)
                    self.replicas.resize(record.replica_id, slots)
            elif current is not None:
                self.replicas.withdraw(record.replica_id)
                log.info(
                    "withdrew replica %s of %s (%s, node %s)",
                    record.replica_id,
                    record.profile_key,
                    record.status,
                    state,
                )
        for replica_id in self._published - set(self.records):
            self.replicas.withdraw(replica_id)
        self._published = {r.replica_id for r in self.records.values() if self.replicas.get(r.replica_id)}

    def _sweep_retired(self, now: float) -> None:
        """Remove the metric series of forgotten replicas once nothing is in flight on them.

        A request that was on a replica when it was forgotten records its metrics when it ends;
        removing the series before that would let it create them again, for good. So a replica
        is swept once it has been seen idle for a while (a request records within microseconds
        of leaving the replica; the grace covers a loaded event loop).
        """
        if not self._retired:
            return
        for replica_id, (replica, idle_since) in list(self._retired.items()):
            if replica_id in self.records:
                del self._retired[replica_id]  # adopted again under the same id: its series live on
            elif replica is not None and replica.in_flight > 0:
                self._retired[replica_id] = (replica, None)
            elif idle_since is None:
                self._retired[replica_id] = (replica, now)
            elif now - idle_since >= _SERIES_GRACE:
                del self._retired[replica_id]
                if self.on_replica_forgotten is not None:
                    self.on_replica_forgotten(replica_id)

    def _send(self, node_id: str, command: Command) -> bool:
        return self.dispatcher.send(node_id, command)

    def _next_id(self) -> str:
        self._command_seq += 1
        return f"c{self._command_seq}"


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
