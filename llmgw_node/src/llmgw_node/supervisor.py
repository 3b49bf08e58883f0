"""Replicas: one supervised engine process each.

Each replica has one task (in the supervisor's nursery) that owns its process from start to stop:
fetch the weights, start the engine in its own session (so its process group holds it and all it
forks), poll its health endpoint until it is ready, then wait for it to exit or be told to stop.
When the engine exits, however it exits, the rest of its group is killed. A crash is reported with the last lines
of output and restarted with exponential backoff up to the replica's limit. Stopping is SIGTERM to
the group, then SIGKILL after a grace period. Draining waits for the engine's in-flight requests
(``/slots``, else ``/metrics``) before stopping.

Engines started by an earlier daemon are found through the state file and adopted (health
checked, then supervised by polling ``/proc``, since they are no longer our children).

A llama.cpp replica's LoRA adapters are verified like its weights and put on its command line; one
that fails verification is left off and its reason is the replica's detail. A vLLM replica's are
loaded each time its engine becomes ready and when control sends ``set_adapters``
(``live_adapters``). Either way the replica's state says which are loaded.

About 750 lines: one replica's task (start, health, exit, restart, drain, adopt) is one state
machine over one process, read top to bottom; the periodic memory measurement of every engine
(``memory``) and the live adapters report through the same replica states.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import attrs
import httpx2
import trio

from llmgw_node import engine_http, live_adapters, memory
from llmgw_node.adapters import AdapterError, check_adapters, replica_files
from llmgw_node.engine_conventions import DIRECTORY_ENGINES, engine_argv, key_environment, loads_adapters_live
from llmgw_node.engines.manager import EngineManager
from llmgw_node.model_dirs import ModelDirError, ModelRoots, check_model_dir
from llmgw_node.offload import offload_problem, read_tail
from llmgw_node.procs import ProcessRecord, StateFile, alive, open_log, signal_group, start_ticks
from llmgw_node.replica_logs import Output, read_output, rotate_if_large
from llmgw_node.weights import WeightsCache, WeightsError
from llmgw_shared import tracing
from llmgw_shared.engine_lifecycle import EngineInstall
from llmgw_shared.logs import get_logger
from llmgw_shared.names import BadName, check_replica_id
from llmgw_shared.replica_lifecycle import NODE_START, TERMINAL, ReplicaStatus, allowed, on_wire
from llmgw_shared.threads import DISK
from llmgw_shared.wire import PORT_IN_USE, AdapterSpec, ReplicaSpec, ReplicaState

log = get_logger(__name__)

# A failed start is reported with the engine's last 30 lines: enough for llama-server's reason
# (a model it cannot load, a port in use) and its context, small enough for one frame.
FAILURE_LINES = 30
# Ended replicas remembered for their final report: a node restarting engines all day must not
# grow its memory with each one.
KEEP_ENDED = 100


class ReplicaError(Exception):
    """A replica command that cannot be carried out; the text is the ack's error."""


@attrs.define
class Timing:
    """Supervision timings; tests shrink them."""

    health_interval: float = 0.25
    # One health request; a hung engine accepts the connection (the kernel does) and never answers.
    health_timeout: float = 2.0
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    stop_grace: float = 10.0
    drain_poll: float = 0.5
    # Polling for the exit of an adopted process (not our child: no wait() possible).
    adopted_poll: float = 0.5
    # A replica that stayed ready this long has its crash counter reset.
    stable_after: float = 300.0
    # Once ready, /health is polled this often; this many failures in a row count as a hang
    # (a stopped process or a wedged engine exits nothing, so only polling notices it).
    ready_health_interval: float = 5.0
    unhealthy_limit: int = 6
    # Each running engine's memory (RSS of its process tree, GPU memory) is measured this often:
    # control accounts free memory from it, and an engine's use settles within seconds of its
    # start (weights mapped, KV cache allocated), so a few measurements a minute are enough.
    measure_interval: float = 15.0


class _Replica:
    """Mutable bookkeeping for one replica; only its own task and the command handlers touch it."""

    def __init__(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        self.state = ReplicaState(replica_id=spec.replica_id, status=on_wire(NODE_START), port=spec.port)
        self.stop_requested = trio.Event()
        self.stop_grace: float | None = None
        self.drain_timeout: float | None = None
        self.done = trio.Event()
        self.pid = 0
        self.ticks = 0
        self.process: trio.Process | None = None
        self.restarts = 0
        self.cancel = trio.CancelScope()
        # The real directory a model_dir resolved to: what the engine was started with, and what
        # the state file records, so a restart after adoption starts it with the same one.
        self.model_path: Path | None = None
        # The last measurement of the engine's process tree (memory.measure), in MiB.
        self.rss_mib = 0
        self.vram_mib = 0
        # Why the replica must not run again (a GPU replica that offloaded nothing): restarts
        # would only repeat it. "" while it may.
        self.fatal = ""
        # The LoRA adapters the running engine has loaded (names, in the spec's order), and why
        # any of the spec's are not ("": all are). One apply at a time per engine.
        self.loaded: list[str] = []
        self.adapter_problem = ""
        # vLLM: every adapter its engine holds, as loaded (a replaced one is compared by its file).
        self.held: list[AdapterSpec] = []
        self.adapter_lock = trio.Lock()
        # llama.cpp: the adapters verified for its start, the only ones on its command line
        # (None: not checked yet), and why the others were refused.
        self.verified: list[str] | None = None
        self.refused = ""


class Supervisor:
    def __init__(
        self,
        data_dir: Path,
        engines: EngineManager,
        weights: WeightsCache,
        client: httpx2.AsyncClient,
        *,
        host: str = "127.0.0.1",
        timing: Timing | None = None,
        on_change: Callable[[ReplicaState], None] | None = None,
        model_roots: ModelRoots | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.logs_dir = data_dir / "shards"
        self.engines = engines
        self.weights = weights
        self.client = client
        self.host = host
        self.timing = timing or Timing()
        self.model_roots = model_roots or ModelRoots((data_dir / "models",), data_dir / "hub")
        self._on_change = on_change
        self._state_file = StateFile(data_dir / "shards.json")
        self._replicas: dict[str, _Replica] = {}
        self._nursery: trio.Nursery | None = None
        # Set when an engine became ready: it is measured then, not only at the next interval,
        # so control accounts what it really holds as soon as it serves.
        self._measure_soon = trio.Event()

    # ------------------------------------------------------------------ public API

    async def run(self, *, adopt: bool = True, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own every replica task; adopt (or stop) engines an earlier daemon left running."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._recover(adopt)
            task_status.started()
            await self._measure_loop()

    def states(self) -> list[ReplicaState]:
        return [s.state for _, s in sorted(self._replicas.items())]

    def state(self, replica_id: str) -> ReplicaState | None:
        replica = self._replicas.get(replica_id)
        return replica.state if replica else None

    def log_path(self, replica_id: str) -> Path:
        return self.logs_dir / f"{replica_id}.log"

    def output(self, replica_id: str, n: int = 300) -> list[str]:
        """The engine's last ``n`` output lines, for the operator."""
        return read_output(self.log_path(replica_id), n).lines

    async def output_since(self, replica_id: str, n: int, cursor: str = "") -> Output | None:
        """The last ``n`` lines after ``cursor`` (``ReplicaLogsReply``); None when the replica has no output here."""
        try:
            check_replica_id(replica_id)  # it names a file
        except BadName:
            return None
        path = self.log_path(replica_id)
        if replica_id not in self._replicas and not await DISK.run(path.is_file, abandon=True):
            return None
        return await DISK.run(read_output, path, n, cursor, abandon=True)

    def start(self, spec: ReplicaSpec) -> None:
        """Begin supervising ``spec``. Idempotent for the same spec; refuses conflicts."""
        try:
            # It names the engine's log file: one plain path component.
            check_replica_id(spec.replica_id)
        except BadName as exc:
            raise ReplicaError(str(exc)) from None
        if not 1 <= spec.port <= 65535:
            raise ReplicaError(f"replica {spec.replica_id}: port {spec.port} is out of range")
        if (spec.weights is None) == (not spec.model_dir):
            raise ReplicaError(f"replica {spec.replica_id}: names weights or a model_dir, not both or neither")
        if spec.engine in DIRECTORY_ENGINES and not spec.model_dir:
            raise ReplicaError(f"replica {spec.replica_id}: {spec.engine} serves a model directory (model_dir)")
        if spec.model_dir:
            try:
                check_model_dir(spec.model_dir)
            except ModelDirError as exc:
                raise ReplicaError(f"replica {spec.replica_id}: {exc}") from None
        try:
            check_adapters(spec)
        except AdapterError as exc:
            raise ReplicaError(str(exc)) from None
        existing = self._replicas.get(spec.replica_id)
        if existing is not None and not existing.done.is_set():
            if existing.spec == spec:
                return
            raise ReplicaError(f"replica {spec.replica_id} is already running with a different spec; stop it first")
        for other in self._replicas.values():
            if other is not existing and other.spec.port == spec.port and not other.done.is_set():
                raise ReplicaError(f"port {spec.port} is already used by replica {other.spec.replica_id}")
        if self.engines.binary(spec.engine, spec.engine_version) is None:
            state = self.engines.state(spec.engine, spec.engine_version)
            if EngineInstall(state.status) is not EngineInstall.INSTALLING:
                raise ReplicaError(
                    f"engine {spec.engine} {spec.engine_version} is not available here: {state.describe()}"
                )
        replica = _Replica(spec)
        self._replicas[spec.replica_id] = replica
        self._spawn(replica, adopted=None)

    def stop(self, replica_id: str, grace: float | None = None) -> bool:
        """Ask a replica to stop; False when there is no such running replica."""
        replica = self._replicas.get(replica_id)
        if replica is None or replica.done.is_set():
            return False
        replica.stop_grace = grace
        replica.stop_requested.set()
        return True

    def drain(self, replica_id: str, timeout: float) -> bool:
        replica = self._replicas.get(replica_id)
        if replica is None or replica.done.is_set():
            return False
        replica.drain_timeout = timeout
        replica.stop_requested.set()
        return True

    def set_adapters(self, replica_id: str, adapters: list[AdapterSpec]) -> None:
        """Bring a running replica's engine to ``adapters`` without restarting it (``set_adapters``)."""
        replica = self._replicas.get(replica_id)
        if replica is None or replica.done.is_set():
            raise ReplicaError(f"replica {replica_id[:100]} is not running here")
        if not loads_adapters_live(replica.spec.engine):
            raise ReplicaError(
                f"replica {replica_id}: {replica.spec.engine} takes its adapters at start only; "
                "start a replica with the new list instead"
            )
        spec = attrs.evolve(replica.spec, adapters=list(adapters))
        try:
            check_adapters(spec)
        except AdapterError as exc:
            raise ReplicaError(str(exc)) from None
        replica.spec = spec
        self._persist()  # an adopting daemon loads the list as it now is
        if ReplicaStatus(replica.state.status) is ReplicaStatus.READY:
            assert self._nursery is not None, "Supervisor.run() must be running"
            self._nursery.start_soon(self._apply_adapters, replica, name=f"adapters:{replica_id}")

    async def stop_all(self, grace: float | None = None) -> None:
        """Stop every replica and wait for all of them (``--stop-engines``)."""
        for replica_id in list(self._replicas):
            self.stop(replica_id, grace)
        for replica in list(self._replicas.values()):
            await replica.done.wait()

    # ------------------------------------------------------------------ internals

    def _spawn(self, replica: _Replica, adopted: ProcessRecord | None) -> None:
        assert self._nursery is not None, "Supervisor.run() must be running"
        for file in replica_files(replica.spec):
            self.weights.acquire(file.sha256, replica.spec.replica_id)
        self._nursery.start_soon(self._supervise, replica, adopted, name=f"replica:{replica.spec.replica_id}")

    def _set(self, replica: _Replica, status: ReplicaStatus, detail: str = "", *, lines: bool = False) -> None:
        """Record and report a change, if ``llmgw_shared.replica_lifecycle``'s table allows it.

        One the table forbids is a bug here, not in the engine: it is logged as an error and
        refused (the replica keeps its status, nothing is sent), since control would ignore it
        anyway and the daemon must not die for it.
        """
        current = ReplicaStatus(replica.state.status)
        if not allowed(current, status):
            log.error(
                "replica %s: %s -> %s is not in the replica lifecycle's table (a bug in the node): "
                "not recorded, not reported (%s)",
                replica.spec.replica_id,
                current,
                status,
                detail,
            )
            return
        state = ReplicaState(
            replica_id=replica.spec.replica_id,
            status=on_wire(status),
            detail=detail,
            port=replica.spec.port,
            pid=replica.pid,
            restarts=replica.restarts,
            last_lines=self.output(replica.spec.replica_id, FAILURE_LINES) if lines else [],
            rss_mib=replica.rss_mib if replica.pid else 0,
            vram_mib=replica.vram_mib if replica.pid else 0,
            adapters=list(replica.loaded) if status == ReplicaStatus.READY else [],
        )
        if state == replica.state:
            return
        replica.state = state
        if status == ReplicaStatus.READY:
            self._measure_soon.set()
        log.info("replica %s: %s", replica.spec.replica_id, state.describe(), extra={"pid": replica.pid})
        if self._on_change is not None:
            self._on_change(state)

    async def _measure_loop(self) -> None:
        while True:
            self._measure_soon = trio.Event()
            await self.measure_once()
            with trio.move_on_after(self.timing.measure_interval):
                await self._measure_soon.wait()

    async def measure_once(self, proc_root: str = "/proc") -> None:
        """Measure every running engine and report the replicas whose use moved noticeably."""
        running = {s.pid: s for s in self._replicas.values() if s.pid and not s.done.is_set()}
        measured = await memory.measure(running, proc_root)
        for pid, (rss, vram) in measured.items():
            replica = running[pid]
            if replica.pid != pid or replica.done.is_set():
                continue  # restarted or ended while it was measured
            if _moved(replica.rss_mib, rss) or _moved(replica.vram_mib, vram):
                replica.rss_mib, replica.vram_mib = rss, vram
                state = attrs.evolve(replica.state, rss_mib=rss, vram_mib=vram)
                replica.state = state
                if self._on_change is not None:
                    self._on_change(state)

    def _forget_old(self, keep: int = KEEP_ENDED) -> None:
        """Ended replicas stay visible (control may not have seen the end yet), but not forever."""
        ended = [sid for sid, s in self._replicas.items() if s.done.is_set()]
        for sid in ended[:-keep] if len(ended) > keep else []:
            del self._replicas[sid]

    def _persist(self) -> None:
        records = []
        for replica in self._replicas.values():
            if replica.pid and not replica.done.is_set():
                records.append(
                    ProcessRecord(
                        replica_id=replica.spec.replica_id,
                        pid=replica.pid,
                        ticks=replica.ticks,
                        binary=str(self.engines.binary(replica.spec.engine, replica.spec.engine_version) or ""),
                        weights=str(self.weights.path_for(replica.spec.weights))
                        if replica.spec.weights is not None
                        else str(replica.model_path or ""),
                        log=str(self.log_path(replica.spec.replica_id)),
                        spec=replica.spec,
                        restarts=replica.restarts,
                        adapters=replica.verified,
                        adapter_problem=replica.refused,
                    )
                )
        self._state_file.save(records)

    async def _recover(self, adopt: bool) -> None:
        for record in self._state_file.load():
            if not alive(record.pid, record.ticks):
                log.info("replica %s from the previous run is gone", record.replica_id)
                continue
            if not adopt:
                log.info("stopping replica %s left by the previous run", record.replica_id, extra={"pid": record.pid})
                await self._terminate(record.pid, record.ticks, None, self.timing.stop_grace)
                continue
            replica = _Replica(record.spec)
            replica.pid, replica.ticks, replica.restarts = record.pid, record.ticks, record.restarts
            replica.verified, replica.refused = record.adapters, record.adapter_problem
            self._replicas[record.spec.replica_id] = replica
            log.info("adopting replica %s", record.replica_id, extra={"pid": record.pid})
            self._spawn(replica, adopted=record)
        self._persist()

    async def _supervise(self, replica: _Replica, adopted: ProcessRecord | None) -> None:
        spec = replica.spec
        try:
            if adopted is None:
                weights = await self._prepare(replica)
                if weights is None:
                    return
            else:
                weights = Path(adopted.weights)
                if spec.weights is None:
                    replica.model_path = weights
            await self._loop(replica, weights, adopted)
        finally:
            replica.done.set()
            for file in replica_files(spec):
                self.weights.give_back(file.sha256, spec.replica_id)
            # Cancelled means the daemon is going away and the engine keeps running for the next
            # one to adopt: its record must stay. Only a replica that really ended leaves the file.
            if replica.state.status in TERMINAL:
                self._persist()
                self._forget_old()

    async def _prepare(self, replica: _Replica) -> Path | None:
        spec = replica.spec
        # Wait for an engine that is still installing (bounded by the replica's own start deadline).
        with trio.move_on_after(max(spec.start_timeout_s, 600.0)):
            while self.engines.binary(spec.engine, spec.engine_version) is None:
                state = self.engines.state(spec.engine, spec.engine_version)
                if EngineInstall(state.status) is not EngineInstall.INSTALLING:
                    break
                if replica.stop_requested.is_set():
                    self._set(replica, ReplicaStatus.STOPPED, "stopped before it started")
                    return None
                self._set(replica, ReplicaStatus.PENDING, f"waiting for engine: {state.describe()}")
                with trio.move_on_after(0.5):
                    await replica.stop_requested.wait()
        if self.engines.binary(spec.engine, spec.engine_version) is None:
            state = self.engines.state(spec.engine, spec.engine_version)
            self._set(replica, ReplicaStatus.FAILED, f"engine {spec.engine} {spec.engine_version}: {state.describe()}")
            return None
        if spec.weights is None:
            try:
                replica.model_path = await DISK.run(self.model_roots.resolve, spec.model_dir, abandon=True)
            except ModelDirError as exc:
                self._set(replica, ReplicaStatus.FAILED, str(exc))
                return None
            return replica.model_path
        weights_spec = spec.weights
        self._set(replica, ReplicaStatus.DOWNLOADING, "checking weights")
        path: Path | None = None
        error = ""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_when, replica.stop_requested, nursery.cancel_scope)
            try:
                await self._verify_adapters(replica)
                path = await self.weights.ensure(
                    weights_spec, lambda what: self._set(replica, ReplicaStatus.DOWNLOADING, what)
                )
            except WeightsError as exc:
                error = str(exc)
            nursery.cancel_scope.cancel()
        if error:
            self._set(replica, ReplicaStatus.FAILED, error)
        elif path is None:
            self._set(replica, ReplicaStatus.STOPPED, "stopped before it started")
        return path

    async def _verify_adapters(self, replica: _Replica) -> None:
        """Fetch and verify the adapters exactly as the weights (sha256, size). One that fails is
        left off the engine's command line and its reason kept for the replica's detail: the base
        model and the other adapters are served, and control routes nothing to the missing one."""
        verified: list[str] = []
        problems: list[str] = []
        for adapter in replica.spec.adapters:
            self._set(replica, ReplicaStatus.DOWNLOADING, f"checking adapter {adapter.name}")
            try:
                await self.weights.ensure(
                    adapter.weights, lambda what: self._set(replica, ReplicaStatus.DOWNLOADING, f"adapter: {what}")
                )
            except WeightsError as exc:
                log.warning("replica %s: adapter %s refused: %s", replica.spec.replica_id, adapter.name, exc)
                problems.append(f"adapter {adapter.name} not loaded: {exc}")
                continue
            verified.append(adapter.name)
        replica.verified, replica.refused = verified, "; ".join(problems)[:2000]

    async def _loop(self, replica: _Replica, weights: Path, adopted: ProcessRecord | None) -> None:
        spec = replica.spec
        t = self.timing
        while True:
            if adopted is not None:
                outcome = await self._watch(replica, adopted=True)
                adopted = None
            else:
                try:
                    await self._launch(replica, weights, fresh=replica.restarts == 0)
                except ReplicaError as exc:
                    self._set(replica, ReplicaStatus.FAILED, str(exc), lines=True)
                    return
                outcome = await self._watch(replica, adopted=False)
            if outcome == "stopped":
                return
            if replica.fatal:
                self._set(replica, ReplicaStatus.FAILED, replica.fatal, lines=True)
                return
            # A crash or a failed start. Report it with the output, then back off and restart.
            replica.restarts += 1
            replica.pid = 0
            replica.rss_mib = replica.vram_mib = 0
            self._persist()
            if replica.restarts > spec.max_restarts:
                self._set(
                    replica, ReplicaStatus.FAILED, f"{outcome}; gave up after {spec.max_restarts} restarts", lines=True
                )
                return
            delay = min(t.backoff_cap, t.backoff_base * 2 ** (replica.restarts - 1))
            self._set(
                replica,
                ReplicaStatus.STARTING,
                f"{outcome}; restart {replica.restarts} of {spec.max_restarts} in {delay:g} s",
                lines=True,
            )
            with trio.move_on_after(delay):
                await replica.stop_requested.wait()
            if replica.stop_requested.is_set():
                self._set(replica, ReplicaStatus.STOPPED, "stopped while waiting to restart")
                return

    async def _launch(self, replica: _Replica, weights: Path, *, fresh: bool) -> None:
        spec = replica.spec
        binary = self.engines.binary(spec.engine, spec.engine_version)
        if binary is None:
            raise ReplicaError(f"engine {spec.engine} {spec.engine_version} is no longer installed")
        if not await DISK.run(engine_http.port_free, self.host, spec.port):
            raise ReplicaError(f"port {spec.port} on {self.host} {PORT_IN_USE}")
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
        env.update(spec.env)
        if spec.devices:
            # The engine sees only its GPUs, renumbered from 0 in this order (CUDA's own rule),
            # through its backend's variable: CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES or
            # GGML_VK_VISIBLE_DEVICES (an engine named by path: the node's GPUs' own).
            backend = self.engines.engine_backend(spec.engine, spec.engine_version) or self.engines.platform.gpu_backend
            env.update(
                self.engines.device_environment(backend or "cuda", spec.devices)
                or {"CUDA_VISIBLE_DEVICES": ",".join(map(str, spec.devices))}
            )
        env.update(key_environment(spec))
        fd = await DISK.run(lambda: open_log(self.log_path(spec.replica_id), fresh=fresh))
        # A span per engine process started (llmgw_shared/tracing.py); a failure is its status.
        with tracing.span(
            "llmgw.replica_start",
            {
                "llmgw.replica": spec.replica_id,
                "llmgw.engine": spec.engine,
                "llmgw.engine_version": spec.engine_version,
                "llmgw.port": spec.port,
            },
        ):
            try:
                proc = await trio.lowlevel.open_process(
                    engine_argv(
                        binary,
                        spec,
                        weights,
                        self.host,
                        [self.weights.path_for(a.weights) for a in _started_adapters(replica)],
                    ),
                    stdin=subprocess.DEVNULL,
                    stdout=fd,
                    stderr=fd,
                    env=env,
                    start_new_session=True,
                    cwd=str(binary.parent),
                )
            except OSError as exc:
                raise ReplicaError(f"could not start {binary.name}: {exc.strerror or exc}") from None
            finally:
                os.close(fd)
        replica.process = proc
        replica.pid = proc.pid
        replica.ticks = start_ticks(proc.pid) or 0
        self._persist()
        self._set(replica, ReplicaStatus.STARTING, f"{binary.name} started")

    async def _watch(self, replica: _Replica, *, adopted: bool) -> str:
        """Run until the process exits or a stop is handled; return "stopped" or what went wrong."""
        spec = replica.spec
        exited = trio.Event()
        exit_text = [""]

        async def wait_exit() -> None:
            if adopted:
                # Not our child, so no wait(): /proc is the only way to see it end.
                while alive(replica.pid, replica.ticks):  # noqa: ASYNC110
                    await trio.sleep(self.timing.adopted_poll)
                exit_text[0] = "exited"
            else:
                assert replica.process is not None
                code = await replica.process.wait()
                exit_text[0] = f"exited with {'signal ' + str(-code) if code < 0 else 'status ' + str(code)}"
            # Whatever the engine forked (vLLM's workers, holding the GPU and the port) dies with
            # it: the group outlives its leader while any member lives, and its id is not reused.
            signal_group(replica.pid, signal.SIGKILL)
            exited.set()

        result = ""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_exit)
            ready = False
            with trio.move_on_after(spec.start_timeout_s) as deadline:
                # Poll often at first (a small model is up in ~50 ms and a request is waiting for
                # it), then back off to the configured interval for engines that load for minutes.
                interval = min(0.02, self.timing.health_interval)
                while not exited.is_set() and not replica.stop_requested.is_set():
                    if await self._healthy(spec):
                        ready = True
                        break
                    with trio.move_on_after(interval):
                        await _first(exited, replica.stop_requested)
                    interval = min(interval * 1.5, self.timing.health_interval)
            if not ready and not replica.stop_requested.is_set():
                if exited.is_set():
                    result = f"crashed while starting: {exit_text[0]}"
                elif deadline.cancelled_caught:
                    result = f"not healthy within {spec.start_timeout_s:g} s"
                    await self._terminate(replica.pid, replica.ticks, replica.process, self.timing.stop_grace)
                nursery.cancel_scope.cancel()
                return result
            if ready and (problem := await self._offload_problem(spec)):
                # Healthy, but not on the GPUs it was placed on: failed, never published.
                replica.fatal = problem
                await self._terminate(replica.pid, replica.ticks, replica.process, self.timing.stop_grace)
                nursery.cancel_scope.cancel()
                return problem
            if ready:
                # A fresh (or restarted, or adopted) engine: what it holds is learned anew.
                replica.loaded, replica.held = [], []
                await self._apply_adapters(replica)
                self._set(replica, ReplicaStatus.READY, replica.adapter_problem)
                hung = await self._while_ready(replica, exited)
                if hung:
                    await self._terminate(replica.pid, replica.ticks, replica.process, self.timing.stop_grace)
                    nursery.cancel_scope.cancel()
                    return hung
            if replica.stop_requested.is_set() and not exited.is_set():
                if replica.drain_timeout is not None:
                    self._set(replica, ReplicaStatus.DRAINING, "waiting for requests in flight")
                    await self._drain(replica, replica.drain_timeout, exited)
                grace = replica.stop_grace if replica.stop_grace is not None else self.timing.stop_grace
                # "draining" while it stops, so nothing treats a stopping engine as ready.
                self._set(replica, ReplicaStatus.DRAINING, "stopping")
                await self._terminate(replica.pid, replica.ticks, replica.process, grace)
                nursery.cancel_scope.cancel()
                self._set(replica, ReplicaStatus.STOPPED, "")
                return "stopped"
            if replica.stop_requested.is_set():
                self._set(replica, ReplicaStatus.STOPPED, "")
                nursery.cancel_scope.cancel()
                return "stopped"
            nursery.cancel_scope.cancel()
            return f"crashed: {exit_text[0]}"

    async def _while_ready(self, replica: _Replica, exited: trio.Event) -> str:
        """Watch a ready engine until it exits or a stop comes; return why it hung, if it did."""
        t = self.timing
        ready_since = trio.current_time()
        failures = 0
        while not exited.is_set() and not replica.stop_requested.is_set():
            with trio.move_on_after(t.ready_health_interval):
                await _first(exited, replica.stop_requested)
            if exited.is_set() or replica.stop_requested.is_set():
                break
            if trio.current_time() - ready_since >= t.stable_after:
                replica.restarts = 0  # stable for a while: earlier crashes no longer count
            # The log is the replica's output ring: bounded while it runs, not only at a restart.
            await DISK.run(rotate_if_large, self.log_path(replica.spec.replica_id))
            failures = 0 if await self._healthy(replica.spec) else failures + 1
            if failures >= t.unhealthy_limit:
                return f"hung: no answer on /health {failures} times in a row"
        return ""

    async def _apply_adapters(self, replica: _Replica) -> None:
        """Load and unload the engine's adapters to match the spec; report what it holds."""
        async with replica.adapter_lock:
            spec, pid = replica.spec, replica.pid
            if not loads_adapters_live(spec.engine):
                # On its command line: loaded once it is ready, or it would not be.
                replica.loaded = [a.name for a in _started_adapters(replica)]
                replica.adapter_problem = replica.refused
                return
            if not spec.adapters and not replica.held:
                return
            wanted, problems = await self._adapter_dirs(spec.adapters)
            applied = await live_adapters.apply(self.client, self.host, spec.port, spec.api_key, wanted, replica.held)
            if replica.pid != pid:
                return  # restarted meanwhile: its next ready applies the list again
            problems += applied.problems
            for problem in problems:
                log.warning("replica %s: %s", spec.replica_id, problem)
            replica.held, replica.loaded = applied.held, applied.loaded
            replica.adapter_problem = "; ".join(problems)[:2000]
        if ReplicaStatus(replica.state.status) is ReplicaStatus.READY:
            self._set(replica, ReplicaStatus.READY, replica.adapter_problem)

    async def _adapter_dirs(self, adapters: list[AdapterSpec]) -> tuple[list[AdapterSpec], list[str]]:
        """The adapters whose directories are inside the node's model roots, with their real paths
        (what the engine is given), and why the others are not loaded."""
        usable: list[AdapterSpec] = []
        problems: list[str] = []
        for adapter in adapters:
            try:
                path = await DISK.run(
                    self.model_roots.resolve, adapter.weights.url.removeprefix("file://"), abandon=True
                )
            except ModelDirError as exc:
                problems.append(f"adapter {adapter.name} not loaded: {exc}")
                continue
            usable.append(attrs.evolve(adapter, weights=attrs.evolve(adapter.weights, url=str(path))))
        return usable, problems

    async def _offload_problem(self, spec: ReplicaSpec) -> str:
        """For a llama.cpp replica placed on GPUs: why its layers are not on them ("" when they are)."""
        if not spec.devices or spec.engine != "llama.cpp":
            return ""
        log_bytes = await DISK.run(read_tail, self.log_path(spec.replica_id), abandon=True)
        return offload_problem(log_bytes, spec.devices)

    async def _healthy(self, spec: ReplicaSpec) -> bool:
        return await engine_http.healthy(self.client, self.host, spec.port, limit_s=self.timing.health_timeout)

    async def _drain(self, replica: _Replica, limit_s: float, exited: trio.Event) -> None:
        with trio.move_on_after(limit_s) as scope:
            while not exited.is_set():
                busy = await engine_http.in_flight(
                    self.client, self.host, replica.spec.port, replica.spec.api_key, replica.spec.engine
                )
                if busy == 0:
                    return
                if busy is None:
                    log.warning(
                        "replica %s: cannot see its in-flight requests (/slots and /metrics both "
                        "unavailable); stopping without waiting",
                        replica.spec.replica_id,
                    )
                    return
                self._set(replica, ReplicaStatus.DRAINING, f"waiting for {busy} request(s) in flight")
                with trio.move_on_after(self.timing.drain_poll):
                    await exited.wait()
        if scope.cancelled_caught:
            log.warning(
                "replica %s: drain timed out after %g s; stopping with requests in flight",
                replica.spec.replica_id,
                limit_s,
            )

    async def _terminate(self, pid: int, ticks: int, process: trio.Process | None, grace: float) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace`` seconds; returns once it is gone."""
        if not pid:
            return
        with trio.CancelScope(shield=True):
            if not alive(pid, ticks) and process is None:
                return
            signal_group(pid, signal.SIGTERM)
            # A stopped process cannot act on SIGTERM until it runs again (systemd does the same).
            signal_group(pid, signal.SIGCONT)
            with trio.move_on_after(grace):
                await self._gone(pid, ticks, process)
                # Children of the engine may outlive it in the group: make sure none do.
                signal_group(pid, signal.SIGKILL)
                return
            log.warning("pid %d did not stop within %g s of SIGTERM; sending SIGKILL", pid, grace)
            signal_group(pid, signal.SIGKILL)
            with trio.move_on_after(5.0):
                await self._gone(pid, ticks, process)

    async def _gone(self, pid: int, ticks: int, process: trio.Process | None) -> None:
        if process is not None:
            await process.wait()
            return
        while alive(pid, ticks):  # noqa: ASYNC110 -- not our child: polling /proc is all there is
            await trio.sleep(0.05)


# A measurement is reported again only when it moved by this share (or from or to zero): every
# heartbeat carries the replicas that changed, and RSS wobbles by a few pages all the time.
_MOVED_SHARE = 0.05


def _started_adapters(replica: _Replica) -> list[AdapterSpec]:
    """The spec's adapters a llama-server is started with: the verified ones, in the spec's order."""
    verified = replica.verified
    return [a for a in replica.spec.adapters if verified is None or a.name in verified]


def _moved(old: int, new: int) -> bool:
    if (old == 0) != (new == 0):
        return True
    return abs(new - old) > old * _MOVED_SHARE


async def _first(*events: trio.Event) -> None:
    """Return as soon as any of ``events`` is set."""
    if any(e.is_set() for e in events):
        return
    async with trio.open_nursery() as nursery:
        for event in events:

            async def waiter(ev: trio.Event = event) -> None:
                await ev.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(waiter)


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
