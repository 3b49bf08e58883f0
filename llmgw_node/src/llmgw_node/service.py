"""The node as one object control can drive: commands in, acks and state reports out.

``NodeService.handle(command) -> Ack`` carries out a wire command (long work such as installs
and engine starts continues in the background), and ``reports`` is the channel of
``EngineStateReport`` / ``ReplicaStateReport`` messages the node emits as things change. The agent attaches
both to the control WebSocket; tests drive them directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import httpx2
import trio

from llmgw_node.config import NodeConfig
from llmgw_node.control_auth import control_client
from llmgw_node.engines.manager import EngineManager, bad_names
from llmgw_node.engines.release import Platform, platform_for
from llmgw_node.probe import probe, with_time_cleared
from llmgw_node.supervisor import ReplicaError, Supervisor, Timing
from llmgw_node.weights import WeightsCache, WeightsError
from llmgw_shared import tracing
from llmgw_shared.facts import HostFacts, unprobed
from llmgw_shared.logs import get_logger
from llmgw_shared.threads import DISK
from llmgw_shared.tracing import open_tracing
from llmgw_shared.wire import (
    PROTOCOL_VERSION,
    TRACE_CONTEXT,
    Ack,
    Command,
    DrainReplica,
    EngineState,
    EngineStateReport,
    GetReplicaLogs,
    Hello,
    RemoveWeights,
    ReplicaLogsReply,
    ReplicaState,
    ReplicaStateReport,
    SetAdapters,
    SetEngines,
    StartReplica,
    StopReplica,
    WeightsHeld,
)

log = get_logger(__name__)

Report = EngineStateReport | ReplicaStateReport
# Reports wait here while the agent is between connections; past this, the oldest are dropped,
# which loses nothing: the next hello or heartbeat carries the current state of everything.
REPORT_BUFFER = 4096
# Host facts (free RAM, disk, GPUs) are probed again this often: placement needs them to be
# minutes fresh, not seconds, and a probe reads /proc and runs nvidia-smi.
FACTS_INTERVAL = 60.0


class NodeService:
    def __init__(
        self,
        config: NodeConfig,
        client: httpx2.AsyncClient,
        *,
        timing: Timing | None = None,
        facts: HostFacts | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.facts = facts or unprobed()
        data = config.data_path
        self._send, self.reports = trio.open_memory_channel[Report](REPORT_BUFFER)
        self.engines = EngineManager.from_config(
            config, client, _platform(self.facts, config.engine_backend), on_change=self._engine_changed
        )
        self.weights = WeightsCache(data, client, on_use_change=self._weights_use_changed)
        self.supervisor = Supervisor(
            data,
            self.engines,
            self.weights,
            client,
            host=config.engine_host,
            model_roots=config.model_dir_roots,
            timing=timing,
            on_change=self._replica_changed,
        )
        self.fencing_token = 0
        self._nursery: trio.Nursery | None = None
        # The weights cache as last listed (hello and heartbeats report it), and a wake-up for
        # listing it again when a replica's state changed (a download finished, a replica ended).
        self.weights_held: list[WeightsHeld] = []
        self._weights_changed = trio.Event()

    # ------------------------------------------------------------------ reports

    def _emit(self, report: Report) -> None:
        try:
            self._send.send_nowait(report)
        except trio.WouldBlock:
            log.debug("report buffer full; dropping a state report (the next heartbeat carries it)")

    def _engine_changed(self, state: EngineState) -> None:
        self._emit(EngineStateReport(engine=state))
        self._mark_degraded()

    def _mark_degraded(self) -> None:
        """GPUs, and only a CPU build to serve with: said in the facts (the next heartbeat carries
        them to control, ``ctl nodes`` and the dashboard) and in the log, once per change."""
        degraded = self.engines.degraded() if self.facts.probed else ""
        if degraded != self.facts.degraded:
            self.facts = attrs.evolve(self.facts, degraded=degraded)
            if degraded:
                log.warning("degraded: %s; GPU profiles are not placed here", degraded)
            else:
                log.info("no longer degraded: a GPU build serves this node's GPUs")

    def _replica_changed(self, state: ReplicaState) -> None:
        self._emit(ReplicaStateReport(replica=state))
        self._weights_changed.set()

    def _weights_use_changed(self) -> None:
        self._weights_changed.set()

    def engine_states(self) -> list[EngineState]:
        return self.engines.states()

    def replica_states(self) -> list[ReplicaState]:
        return self.supervisor.states()

    def hello(self) -> Hello:
        return Hello(
            protocol_version=PROTOCOL_VERSION,
            node_id=self.config.node_id,
            join_token=self.config.token,
            facts=self.facts,
            engines=self.engine_states(),
            replicas=self.replica_states(),
            address=self.config.advertised_address,
            weights=list(self.weights_held),
            # StartReplica and SetEngines may carry control's traceparent (wire.py).
            features=[TRACE_CONTEXT],
        )

    # ------------------------------------------------------------------ life

    async def run(self, *, adopt: bool = True, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if not self.facts.probed:
                await self.refresh_facts()
            await self.engines.load()
            await nursery.start(lambda task_status: self.supervisor.run(adopt=adopt, task_status=task_status))
            nursery.start_soon(self.engines.run_rechecks, self.config.recheck_interval_s)
            await self.refresh_weights()
            nursery.start_soon(self._facts_loop)
            nursery.start_soon(self._weights_loop)
            task_status.started()

    async def refresh_facts(self) -> bool:
        """Probe again; True when something placement cares about changed."""
        facts = await probe(self.config.data_path)
        facts = attrs.evolve(facts, degraded=self.facts.degraded)
        changed = with_time_cleared(facts) != with_time_cleared(self.facts)
        self.facts = facts
        self.engines.platform = _platform(facts, self.config.engine_backend)
        self._mark_degraded()
        for warning in facts.warnings:
            log.warning(warning)
        return changed

    async def refresh_weights(self) -> None:
        self.weights_held = await DISK.run(self.weights.held, abandon=True)

    async def _weights_loop(self) -> None:
        while True:
            with trio.move_on_after(FACTS_INTERVAL):
                await self._weights_changed.wait()
            # A fresh event before the listing, not after: a change during the listing (a file
            # released while the thread reads the directory) must wake the next one, not be lost.
            self._weights_changed = trio.Event()
            await self.refresh_weights()

    async def _facts_loop(self) -> None:
        while True:
            await trio.sleep(FACTS_INTERVAL)
            await self.refresh_facts()

    async def stop_engines(self, grace: float | None = None) -> None:
        await self.supervisor.stop_all(grace)

    # ------------------------------------------------------------------ commands

    async def handle(self, command: Command) -> Ack:
        """Carry out one command from control. Never raises for a bad command: the ack says why."""
        if command.fencing_token < self.fencing_token:
            return Ack(
                command_id=command.id,
                ok=False,
                error=f"stale fencing token {command.fencing_token} (this node has seen "
                f"{self.fencing_token}): a newer control leader is in charge",
            )
        self.fencing_token = command.fencing_token
        try:
            error = self._dispatch(command)
        except (ReplicaError, WeightsError) as exc:
            error = str(exc)
        except Exception as exc:
            # A bug, not a bad command: the ack says so and the node keeps serving.
            log.error("command %s crashed", type(command).__name__, exc_info=True, extra={"command_id": command.id})
            error = f"unexpected error: {type(exc).__name__}: {exc}"
        if error:
            log.warning("command %s refused: %s", type(command).__name__, error, extra={"command_id": command.id})
        return Ack(command_id=command.id, ok=not error, error=error)

    async def replica_logs(self, request: GetReplicaLogs) -> ReplicaLogsReply:
        """A replica's last output lines for control (``GetReplicaLogs``); never raises."""
        try:
            output = await self.supervisor.output_since(request.replica_id, request.lines, request.cursor)
        except Exception:
            log.error("reading the output of replica %s crashed", request.replica_id, exc_info=True)
            output = None
        if output is None:
            return ReplicaLogsReply(in_reply_to=request.id, replica_id=request.replica_id, found=False)
        return ReplicaLogsReply(
            in_reply_to=request.id, replica_id=request.replica_id, found=True, lines=output.lines, cursor=output.cursor
        )

    def _dispatch(self, command: Command) -> str:
        assert self._nursery is not None, "NodeService.run() must be running"
        if isinstance(command, SetEngines):
            # The fencing token is the leader's epoch: each install records it as who asked.
            # Each install's span is a child of control's command span (tasks inherit the context).
            with tracing.remote_parent(command.traceparent):
                for spec in self.engines.want(command.engines, control_epoch=command.fencing_token):
                    self._nursery.start_soon(self.engines.install, spec, name=f"install:{spec.name}:{spec.version}")
            # The others are refused here, in the ack: a report naming them would not decode.
            return "; ".join(problem for spec in command.engines if (problem := bad_names(spec)))
        if isinstance(command, StartReplica):
            problem = device_problem(command.replica.devices, [g.index for g in self.facts.gpus])
            if problem:
                return f"replica {command.replica.replica_id}: {problem}"
            # The replica's task, and so its start spans, begin under control's command span.
            with tracing.remote_parent(command.traceparent):
                self.supervisor.start(command.replica)
            return ""
        if isinstance(command, StopReplica):
            # Idempotent: stopping a replica that is not running is already done.
            self.supervisor.stop(command.replica_id, command.grace_s)
            return ""
        if isinstance(command, DrainReplica):
            self.supervisor.drain(command.replica_id, command.timeout_s)
            return ""
        if isinstance(command, SetAdapters):
            self.supervisor.set_adapters(command.replica_id, command.adapters)
            return ""
        if isinstance(command, RemoveWeights):
            _removed, kept = self.weights.remove(command.sha256)
            self._weights_changed.set()
            if kept:
                return f"kept {len(kept)} file(s) a running replica uses: {', '.join(k[:12] for k in kept)}"
            return ""
        return f"not a command: {type(command).__name__}"


def device_problem(devices: list[int], gpus: list[int]) -> str:
    """Why a replica may not run on ``devices`` here ("" when it may): each must be a GPU this node
    reported, once."""
    if len(set(devices)) != len(devices):
        return f"GPU devices {devices} name a GPU twice"
    missing = [d for d in devices if d not in gpus]
    if missing:
        have = ", ".join(map(str, gpus)) or "none"
        return f"GPU device(s) {', '.join(map(str, missing))} are not on this node (it has: {have})"
    return ""


def _platform(facts: HostFacts, pin: str = "") -> Platform:
    # Until the first probe, assume the common case; run() probes before any install can start.
    return platform_for(facts, pin)


@asynccontextmanager
async def open_node_service(
    config: NodeConfig,
    *,
    timing: Timing | None = None,
    facts: HostFacts | None = None,
    adopt: bool = True,
    stop_engines_on_exit: bool = False,
) -> AsyncIterator[NodeService]:
    """A running NodeService; on exit its tasks end and engines keep running (unless asked)."""
    # Engines and weights may come from control's own file server, behind the same TLS (and the
    # same client certificate) as the agent socket, and for enrolled nodes only: the node's
    # credentials go with every request to control (control_auth), and to nothing else.
    async with (
        open_tracing(config.tracing, "llmgw-node"),
        control_client(config) as client,
        trio.open_nursery() as nursery,
    ):
        svc = NodeService(config, client, timing=timing, facts=facts)
        await nursery.start(lambda task_status: svc.run(adopt=adopt, task_status=task_status))
        try:
            yield svc
        finally:
            if stop_engines_on_exit:
                with trio.CancelScope(shield=True):
                    await svc.stop_engines()
            nursery.cancel_scope.cancel()
