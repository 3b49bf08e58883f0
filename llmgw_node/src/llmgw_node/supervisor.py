"""Shards: one supervised engine process each.

Each shard has one task (in the supervisor's nursery) that owns its process from start to stop:
fetch the weights, start the engine in its own session (so its process group holds it and all it
forks), poll its health endpoint until it is ready, then wait for it to exit or be told to stop.
When the engine exits, however it exits, the rest of its group is killed. A crash is reported with the last lines
of output and restarted with exponential backoff up to the shard's limit. Stopping is SIGTERM to
the group, then SIGKILL after a grace period. Draining waits for the engine's in-flight requests
(``/slots``, else ``/metrics``) before stopping.

Engines started by an earlier daemon are found through the state file and adopted (health
checked, then supervised by polling ``/proc``, since they are no longer our children).

A vLLM shard's LoRA adapters are loaded each time its engine becomes ready and when control sends
``set_adapters`` (``live_adapters``); the shard's state says which are loaded.

About 680 lines: one shard's task (start, health, exit, restart, drain, adopt) is one state
machine over one process, read top to bottom; the periodic memory measurement of every engine
(``memory``) and the live adapters report through the same shard states.
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
from llmgw_node.adapters import AdapterError, check_adapters, shard_files
from llmgw_node.engine_conventions import DIRECTORY_ENGINES, engine_argv, key_environment, loads_adapters_live
from llmgw_node.engines.manager import EngineManager
from llmgw_node.model_dirs import ModelDirError, ModelRoots, check_model_dir
from llmgw_node.offload import offload_problem, read_tail
from llmgw_node.procs import ProcessRecord, StateFile, alive, open_log, signal_group, start_ticks
from llmgw_node.shard_logs import Output, read_output, rotate_if_large
from llmgw_node.weights import WeightsCache, WeightsError
from llmgw_shared import tracing
from llmgw_shared.logs import get_logger
from llmgw_shared.names import BadName, check_shard_id
from llmgw_shared.replica_lifecycle import NODE_START, TERMINAL, ReplicaStatus, allowed, on_wire
from llmgw_shared.threads import DISK
from llmgw_shared.wire import PORT_IN_USE, AdapterSpec, ShardSpec, ShardState

log = get_logger(__name__)

# A failed start is reported with the engine's last 30 lines: enough for llama-server's reason
# (a model it cannot load, a port in use) and its context, small enough for one frame.
FAILURE_LINES = 30
# Ended shards remembered for their final report: a node restarting engines all day must not
# grow its memory with each one.
KEEP_ENDED = 100


class ShardError(Exception):
    """A shard command that cannot be carried out; the text is the ack's error."""


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
    # A shard that stayed ready this long has its crash counter reset.
    stable_after: float = 300.0
    # Once ready, /health is polled this often; this many failures in a row count as a hang
    # (a stopped process or a wedged engine exits nothing, so only polling notices it).
    ready_health_interval: float = 5.0
    unhealthy_limit: int = 6
    # Each running engine's memory (RSS of its process tree, GPU memory) is measured this often:
    # control accounts free memory from it, and an engine's use settles within seconds of its
    # start (weights mapped, KV cache allocated), so a few measurements a minute are enough.
    measure_interval: float = 15.0


class _Shard:
    """Mutable bookkeeping for one shard; only its own task and the command handlers touch it."""

    def __init__(self, spec: ShardSpec) -> None:
        self.spec = spec
        self.state = ShardState(shard_id=spec.shard_id, status=on_wire(NODE_START), port=spec.port)
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
        # Why the shard must not run again (a GPU replica that offloaded nothing): restarts
        # would only repeat it. "" while it may.
        self.fatal = ""
        # The LoRA adapters the running engine has loaded (names, in the spec's order), and why
        # any of the spec's are not ("": all are). One apply at a time per engine.
        self.loaded: list[str] = []
        self.adapter_problem = ""
        self.adapter_lock = trio.Lock()


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
        on_change: Callable[[ShardState], None] | None = None,
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
        self._shards: dict[str, _Shard] = {}
        self._nursery: trio.Nursery | None = None
        # Set when an engine became ready: it is measured then, not only at the next interval,
        # so control accounts what it really holds as soon as it serves.
        self._measure_soon = trio.Event()

    # ------------------------------------------------------------------ public API

    async def run(
        self, *, adopt: bool = True, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Own every shard task; adopt (or stop) engines an earlier daemon left running."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._recover(adopt)
            task_status.started()
            await self._measure_loop()

    def states(self) -> list[ShardState]:
        return [s.state for _, s in sorted(self._shards.items())]

    def state(self, shard_id: str) -> ShardState | None:
        shard = self._shards.get(shard_id)
        return shard.state if shard else None

    def log_path(self, shard_id: str) -> Path:
        return self.logs_dir / f"{shard_id}.log"

    def output(self, shard_id: str, n: int = 300) -> list[str]:
        """The engine's last ``n`` output lines, for the operator."""
        return read_output(self.log_path(shard_id), n).lines

    async def output_since(self, shard_id: str, n: int, cursor: str = "") -> Output | None:
        """The last ``n`` lines after ``cursor`` (``shard_logs``); None when the shard has no output here."""
        try:
            check_shard_id(shard_id)  # it names a file
        except BadName:
            return None
        path = self.log_path(shard_id)
        if shard_id not in self._shards and not await DISK.run(path.is_file, abandon=True):
            return None
        return await DISK.run(read_output, path, n, cursor, abandon=True)

    def start(self, spec: ShardSpec) -> None:
        """Begin supervising ``spec``. Idempotent for the same spec; refuses conflicts."""
        try:
            # It names the engine's log file: one plain path component.
            check_shard_id(spec.shard_id)
        except BadName as exc:
            raise ShardError(str(exc)) from None
        if not 1 <= spec.port <= 65535:
            raise ShardError(f"shard {spec.shard_id}: port {spec.port} is out of range")
        if (spec.weights is None) == (not spec.model_dir):
            raise ShardError(f"shard {spec.shard_id}: names weights or a model_dir, not both or neither")
        if spec.engine in DIRECTORY_ENGINES and not spec.model_dir:
            raise ShardError(f"shard {spec.shard_id}: {spec.engine} serves a model directory (model_dir)")
        if spec.model_dir:
            try:
                check_model_dir(spec.model_dir)
            except ModelDirError as exc:
                raise ShardError(f"shard {spec.shard_id}: {exc}") from None
        try:
            check_adapters(spec)
        except AdapterError as exc:
            raise ShardError(str(exc)) from None
        existing = self._shards.get(spec.shard_id)
        if existing is not None and not existing.done.is_set():
            if existing.spec == spec:
                return
            raise ShardError(f"shard {spec.shard_id} is already running with a different spec; stop it first")
        for other in self._shards.values():
            if other is not existing and other.spec.port == spec.port and not other.done.is_set():
                raise ShardError(f"port {spec.port} is already used by shard {other.spec.shard_id}")
        if self.engines.binary(spec.engine, spec.engine_version) is None:
            state = self.engines.state(spec.engine, spec.engine_version)
            if state.status != "installing":
                raise ShardError(f"engine {spec.engine} {spec.engine_version} is not available here: "
                                 f"{state.describe()}")
        shard = _Shard(spec)
        self._shards[spec.shard_id] = shard
        self._spawn(shard, adopted=None)

    def stop(self, shard_id: str, grace: float | None = None) -> bool:
        """Ask a shard to stop; False when there is no such running shard."""
        shard = self._shards.get(shard_id)
        if shard is None or shard.done.is_set():
            return False
        shard.stop_grace = grace
        shard.stop_requested.set()
        return True

    def drain(self, shard_id: str, timeout: float) -> bool:
        shard = self._shards.get(shard_id)
        if shard is None or shard.done.is_set():
            return False
        shard.drain_timeout = timeout
        shard.stop_requested.set()
        return True

    def set_adapters(self, shard_id: str, adapters: list[AdapterSpec]) -> None:
        """Bring a running shard's engine to ``adapters`` without restarting it (``set_adapters``)."""
        shard = self._shards.get(shard_id)
        if shard is None or shard.done.is_set():
            raise ShardError(f"shard {shard_id[:100]} is not running here")
        if not loads_adapters_live(shard.spec.engine):
            raise ShardError(f"shard {shard_id}: {shard.spec.engine} takes its adapters at start only; "
                             "start a replica with the new list instead")
        spec = attrs.evolve(shard.spec, adapters=list(adapters))
        try:
            check_adapters(spec)
        except AdapterError as exc:
            raise ShardError(str(exc)) from None
        shard.spec = spec
        self._persist()  # an adopting daemon loads the list as it now is
        if ReplicaStatus(shard.state.status) is ReplicaStatus.READY:
            assert self._nursery is not None, "Supervisor.run() must be running"
            self._nursery.start_soon(self._apply_adapters, shard, name=f"adapters:{shard_id}")

    async def stop_all(self, grace: float | None = None) -> None:
        """Stop every shard and wait for all of them (``--stop-engines``)."""
        for shard_id in list(self._shards):
            self.stop(shard_id, grace)
        for shard in list(self._shards.values()):
            await shard.done.wait()

    # ------------------------------------------------------------------ internals

    def _spawn(self, shard: _Shard, adopted: ProcessRecord | None) -> None:
        assert self._nursery is not None, "Supervisor.run() must be running"
        for file in shard_files(shard.spec):
            self.weights.acquire(file.sha256, shard.spec.shard_id)
        self._nursery.start_soon(self._supervise, shard, adopted, name=f"shard:{shard.spec.shard_id}")

    def _set(self, shard: _Shard, status: ReplicaStatus, detail: str = "", *, lines: bool = False) -> None:
        """Record and report a change, if ``llmgw_shared.replica_lifecycle``'s table allows it.

        One the table forbids is a bug here, not in the engine: it is logged as an error and
        refused (the replica keeps its status, nothing is sent), since control would ignore it
        anyway and the daemon must not die for it.
        """
        current = ReplicaStatus(shard.state.status)
        if not allowed(current, status):
            log.error("shard %s: %s -> %s is not in the replica lifecycle's table (a bug in the node): "
                      "not recorded, not reported (%s)", shard.spec.shard_id, current, status, detail)
            return
        state = ShardState(
            shard_id=shard.spec.shard_id, status=on_wire(status), detail=detail, port=shard.spec.port, pid=shard.pid,
            restarts=shard.restarts,
            last_lines=self.output(shard.spec.shard_id, FAILURE_LINES) if lines else [],
            rss_mib=shard.rss_mib if shard.pid else 0, vram_mib=shard.vram_mib if shard.pid else 0,
            adapters=list(shard.loaded) if status == "ready" else [],
        )
        if state == shard.state:
            return
        shard.state = state
        if status == ReplicaStatus.READY:
            self._measure_soon.set()
        log.info("shard %s: %s", shard.spec.shard_id, state.describe(), extra={"pid": shard.pid})
        if self._on_change is not None:
            self._on_change(state)

    async def _measure_loop(self) -> None:
        while True:
            self._measure_soon = trio.Event()
            await self.measure_once()
            with trio.move_on_after(self.timing.measure_interval):
                await self._measure_soon.wait()

    async def measure_once(self, proc_root: str = "/proc") -> None:
        """Measure every running engine and report the shards whose use moved noticeably."""
        running = {s.pid: s for s in self._shards.values() if s.pid and not s.done.is_set()}
        measured = await memory.measure(running, proc_root)
        for pid, (rss, vram) in measured.items():
            shard = running[pid]
            if shard.pid != pid or shard.done.is_set():
                continue  # restarted or ended while it was measured
            if _moved(shard.rss_mib, rss) or _moved(shard.vram_mib, vram):
                shard.rss_mib, shard.vram_mib = rss, vram
                state = attrs.evolve(shard.state, rss_mib=rss, vram_mib=vram)
                shard.state = state
                if self._on_change is not None:
                    self._on_change(state)

    def _forget_old(self, keep: int = KEEP_ENDED) -> None:
        """Ended shards stay visible (control may not have seen the end yet), but not forever."""
        ended = [sid for sid, s in self._shards.items() if s.done.is_set()]
        for sid in ended[:-keep] if len(ended) > keep else []:
            del self._shards[sid]

    def _persist(self) -> None:
        records = []
        for shard in self._shards.values():
            if shard.pid and not shard.done.is_set():
                records.append(ProcessRecord(
                    shard_id=shard.spec.shard_id, pid=shard.pid, ticks=shard.ticks,
                    binary=str(self.engines.binary(shard.spec.engine, shard.spec.engine_version) or ""),
                    weights=str(self.weights.path_for(shard.spec.weights)) if shard.spec.weights is not None
                    else str(shard.model_path or ""),
                    log=str(self.log_path(shard.spec.shard_id)), spec=shard.spec, restarts=shard.restarts,
                ))
        self._state_file.save(records)

    async def _recover(self, adopt: bool) -> None:
        for record in self._state_file.load():
            if not alive(record.pid, record.ticks):
                log.info("shard %s from the previous run is gone", record.shard_id)
                continue
            if not adopt:
                log.info("stopping shard %s left by the previous run", record.shard_id,
                         extra={"pid": record.pid})
                await self._terminate(record.pid, record.ticks, None, self.timing.stop_grace)
                continue
            shard = _Shard(record.spec)
            shard.pid, shard.ticks, shard.restarts = record.pid, record.ticks, record.restarts
            self._shards[record.spec.shard_id] = shard
            log.info("adopting shard %s", record.shard_id, extra={"pid": record.pid})
            self._spawn(shard, adopted=record)
        self._persist()

    async def _supervise(self, shard: _Shard, adopted: ProcessRecord | None) -> None:
        spec = shard.spec
        try:
            if adopted is None:
                weights = await self._prepare(shard)
                if weights is None:
                    return
            else:
                weights = Path(adopted.weights)
                if spec.weights is None:
                    shard.model_path = weights
            await self._loop(shard, weights, adopted)
        finally:
            shard.done.set()
            for file in shard_files(spec):
                self.weights.release(file.sha256, spec.shard_id)
            # Cancelled means the daemon is going away and the engine keeps running for the next
            # one to adopt: its record must stay. Only a shard that really ended leaves the file.
            if shard.state.status in TERMINAL:
                self._persist()
                self._forget_old()

    async def _prepare(self, shard: _Shard) -> Path | None:
        spec = shard.spec
        # Wait for an engine that is still installing (bounded by the shard's own start deadline).
        with trio.move_on_after(max(spec.start_timeout_s, 600.0)):
            while self.engines.binary(spec.engine, spec.engine_version) is None:
                state = self.engines.state(spec.engine, spec.engine_version)
                if state.status != "installing":
                    break
                if shard.stop_requested.is_set():
                    self._set(shard, ReplicaStatus.STOPPED, "stopped before it started")
                    return None
                self._set(shard, ReplicaStatus.PENDING, f"waiting for engine: {state.describe()}")
                with trio.move_on_after(0.5):
                    await shard.stop_requested.wait()
        if self.engines.binary(spec.engine, spec.engine_version) is None:
            state = self.engines.state(spec.engine, spec.engine_version)
            self._set(shard, ReplicaStatus.FAILED, f"engine {spec.engine} {spec.engine_version}: {state.describe()}")
            return None
        if spec.weights is None:
            try:
                shard.model_path = await DISK.run(self.model_roots.resolve, spec.model_dir, abandon=True)
            except ModelDirError as exc:
                self._set(shard, ReplicaStatus.FAILED, str(exc))
                return None
            return shard.model_path
        weights_spec = spec.weights
        self._set(shard, ReplicaStatus.DOWNLOADING, "checking weights")
        path: Path | None = None
        error = ""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_when, shard.stop_requested, nursery.cancel_scope)
            try:
                # The adapters first, exactly as the weights (sha256, size): a wrong one fails the
                # shard before the engine is started with it.
                for adapter in spec.adapters:
                    self._set(shard, ReplicaStatus.DOWNLOADING, f"checking adapter {adapter.name}")
                    await self.weights.ensure(
                        adapter.weights, lambda what: self._set(shard, ReplicaStatus.DOWNLOADING, f"adapter: {what}"))
                path = await self.weights.ensure(
                    weights_spec, lambda what: self._set(shard, ReplicaStatus.DOWNLOADING, what)
                )
            except WeightsError as exc:
                error = str(exc)
            nursery.cancel_scope.cancel()
        if error:
            self._set(shard, ReplicaStatus.FAILED, error)
        elif path is None:
            self._set(shard, ReplicaStatus.STOPPED, "stopped before it started")
        return path

    async def _loop(self, shard: _Shard, weights: Path, adopted: ProcessRecord | None) -> None:
        spec = shard.spec
        t = self.timing
        while True:
            if adopted is not None:
                outcome = await self._watch(shard, adopted=True)
                adopted = None
            else:
                try:
                    await self._launch(shard, weights, fresh=shard.restarts == 0)
                except ShardError as exc:
                    self._set(shard, ReplicaStatus.FAILED, str(exc), lines=True)
                    return
                outcome = await self._watch(shard, adopted=False)
            if outcome == "stopped":
                return
            if shard.fatal:
                self._set(shard, ReplicaStatus.FAILED, shard.fatal, lines=True)
                return
            # A crash or a failed start. Report it with the output, then back off and restart.
            shard.restarts += 1
            shard.pid = 0
            shard.rss_mib = shard.vram_mib = 0
            self._persist()
            if shard.restarts > spec.max_restarts:
                self._set(shard, ReplicaStatus.FAILED, f"{outcome}; gave up after {spec.max_restarts} restarts",
                          lines=True)
                return
            delay = min(t.backoff_cap, t.backoff_base * 2 ** (shard.restarts - 1))
            self._set(shard, ReplicaStatus.STARTING,
                      f"{outcome}; restart {shard.restarts} of {spec.max_restarts} in {delay:g} s",
                      lines=True)
            with trio.move_on_after(delay):
                await shard.stop_requested.wait()
            if shard.stop_requested.is_set():
                self._set(shard, ReplicaStatus.STOPPED, "stopped while waiting to restart")
                return

    async def _launch(self, shard: _Shard, weights: Path, *, fresh: bool) -> None:
        spec = shard.spec
        binary = self.engines.binary(spec.engine, spec.engine_version)
        if binary is None:
            raise ShardError(f"engine {spec.engine} {spec.engine_version} is no longer installed")
        if not await DISK.run(engine_http.port_free, self.host, spec.port):
            raise ShardError(f"port {spec.port} on {self.host} {PORT_IN_USE}")
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
        env.update(spec.env)
        if spec.devices:
            # The engine sees only its GPUs, renumbered from 0 in this order (CUDA's own rule),
            # through its backend's variable: CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES or
            # GGML_VK_VISIBLE_DEVICES (an engine named by path: the node's GPUs' own).
            backend = self.engines.engine_backend(spec.engine, spec.engine_version) or self.engines.platform.gpu_backend
            env.update(self.engines.device_environment(backend or "cuda", spec.devices)
                       or {"CUDA_VISIBLE_DEVICES": ",".join(map(str, spec.devices))})
        env.update(key_environment(spec))
        fd = await DISK.run(lambda: open_log(self.log_path(spec.shard_id), fresh=fresh))
        # A span per engine process started (llmgw_shared/tracing.py); a failure is its status.
        with tracing.span("llmgw.replica_start", {"llmgw.replica": spec.shard_id, "llmgw.engine": spec.engine,
                                                  "llmgw.engine_version": spec.engine_version,
                                                  "llmgw.port": spec.port}):
            try:
                proc = await trio.lowlevel.open_process(
                    engine_argv(binary, spec, weights, self.host,
                                [self.weights.path_for(a.weights) for a in spec.adapters]), stdin=subprocess.DEVNULL,
                    stdout=fd, stderr=fd, env=env, start_new_session=True, cwd=str(binary.parent),
                )
            except OSError as exc:
                raise ShardError(f"could not start {binary.name}: {exc.strerror or exc}") from None
            finally:
                os.close(fd)
        shard.process = proc
        shard.pid = proc.pid
        shard.ticks = start_ticks(proc.pid) or 0
        self._persist()
        self._set(shard, ReplicaStatus.STARTING, f"{binary.name} started")

    async def _watch(self, shard: _Shard, *, adopted: bool) -> str:
        """Run until the process exits or a stop is handled; return "stopped" or what went wrong."""
        spec = shard.spec
        exited = trio.Event()
        exit_text = [""]

        async def wait_exit() -> None:
            if adopted:
                # Not our child, so no wait(): /proc is the only way to see it end.
                while alive(shard.pid, shard.ticks):  # noqa: ASYNC110
                    await trio.sleep(self.timing.adopted_poll)
                exit_text[0] = "exited"
            else:
                assert shard.process is not None
                code = await shard.process.wait()
                exit_text[0] = f"exited with {'signal ' + str(-code) if code < 0 else 'status ' + str(code)}"
            # Whatever the engine forked (vLLM's workers, holding the GPU and the port) dies with
            # it: the group outlives its leader while any member lives, and its id is not reused.
            signal_group(shard.pid, signal.SIGKILL)
            exited.set()

        result = ""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_exit)
            ready = False
            with trio.move_on_after(spec.start_timeout_s) as deadline:
                # Poll often at first (a small model is up in ~50 ms and a request is waiting for
                # it), then back off to the configured interval for engines that load for minutes.
                interval = min(0.02, self.timing.health_interval)
                while not exited.is_set() and not shard.stop_requested.is_set():
                    if await self._healthy(spec):
                        ready = True
                        break
                    with trio.move_on_after(interval):
                        await _first(exited, shard.stop_requested)
                    interval = min(interval * 1.5, self.timing.health_interval)
            if not ready and not shard.stop_requested.is_set():
                if exited.is_set():
                    result = f"crashed while starting: {exit_text[0]}"
                elif deadline.cancelled_caught:
                    result = f"not healthy within {spec.start_timeout_s:g} s"
                    await self._terminate(shard.pid, shard.ticks, shard.process, self.timing.stop_grace)
                nursery.cancel_scope.cancel()
                return result
            if ready and (problem := await self._offload_problem(spec)):
                # Healthy, but not on the GPUs it was placed on: failed, never published.
                shard.fatal = problem
                await self._terminate(shard.pid, shard.ticks, shard.process, self.timing.stop_grace)
                nursery.cancel_scope.cancel()
                return problem
            if ready:
                # A fresh (or restarted, or adopted) engine: what it holds is learned anew.
                shard.loaded = []
                await self._apply_adapters(shard)
                self._set(shard, ReplicaStatus.READY, shard.adapter_problem)
                hung = await self._while_ready(shard, exited)
                if hung:
                    await self._terminate(shard.pid, shard.ticks, shard.process, self.timing.stop_grace)
                    nursery.cancel_scope.cancel()
                    return hung
            if shard.stop_requested.is_set() and not exited.is_set():
                if shard.drain_timeout is not None:
                    self._set(shard, ReplicaStatus.DRAINING, "waiting for requests in flight")
                    await self._drain(shard, shard.drain_timeout, exited)
                grace = shard.stop_grace if shard.stop_grace is not None else self.timing.stop_grace
                # "draining" while it stops, so nothing treats a stopping engine as ready.
                self._set(shard, ReplicaStatus.DRAINING, "stopping")
                await self._terminate(shard.pid, shard.ticks, shard.process, grace)
                nursery.cancel_scope.cancel()
                self._set(shard, ReplicaStatus.STOPPED, "")
                return "stopped"
            if shard.stop_requested.is_set():
                self._set(shard, ReplicaStatus.STOPPED, "")
                nursery.cancel_scope.cancel()
                return "stopped"
            nursery.cancel_scope.cancel()
            return f"crashed: {exit_text[0]}"

    async def _while_ready(self, shard: _Shard, exited: trio.Event) -> str:
        """Watch a ready engine until it exits or a stop comes; return why it hung, if it did."""
        t = self.timing
        ready_since = trio.current_time()
        failures = 0
        while not exited.is_set() and not shard.stop_requested.is_set():
            with trio.move_on_after(t.ready_health_interval):
                await _first(exited, shard.stop_requested)
            if exited.is_set() or shard.stop_requested.is_set():
                break
            if trio.current_time() - ready_since >= t.stable_after:
                shard.restarts = 0  # stable for a while: earlier crashes no longer count
            # The log is the shard's output ring: bounded while it runs, not only at a restart.
            await DISK.run(rotate_if_large, self.log_path(shard.spec.shard_id))
            failures = 0 if await self._healthy(shard.spec) else failures + 1
            if failures >= t.unhealthy_limit:
                return f"hung: no answer on /health {failures} times in a row"
        return ""

    async def _apply_adapters(self, shard: _Shard) -> None:
        """Load and unload the engine's adapters to match the spec; report what it holds."""
        async with shard.adapter_lock:
            spec, pid = shard.spec, shard.pid
            if not loads_adapters_live(spec.engine):
                # On its command line: loaded once it is ready, or it would not be.
                shard.loaded, shard.adapter_problem = [a.name for a in spec.adapters], ""
                return
            if not spec.adapters and not shard.loaded:
                return
            wanted, problems = await self._adapter_dirs(spec.adapters)
            applied = await live_adapters.apply(self.client, self.host, spec.port, spec.api_key, wanted,
                                                shard.loaded)
            if shard.pid != pid:
                return  # restarted meanwhile: its next ready applies the list again
            problems += applied.problems
            for problem in problems:
                log.warning("shard %s: %s", spec.shard_id, problem)
            shard.loaded, shard.adapter_problem = applied.loaded, "; ".join(problems)[:2000]
        if ReplicaStatus(shard.state.status) is ReplicaStatus.READY:
            self._set(shard, ReplicaStatus.READY, shard.adapter_problem)

    async def _adapter_dirs(self, adapters: list[AdapterSpec]) -> tuple[list[AdapterSpec], list[str]]:
        """The adapters whose directories are inside the node's model roots, with their real paths
        (what the engine is given), and why the others are not loaded."""
        usable: list[AdapterSpec] = []
        problems: list[str] = []
        for adapter in adapters:
            try:
                path = await DISK.run(self.model_roots.resolve, adapter.weights.url.removeprefix("file://"),
                                      abandon=True)
            except ModelDirError as exc:
                problems.append(f"adapter {adapter.name} not loaded: {exc}")
                continue
            usable.append(attrs.evolve(adapter, weights=attrs.evolve(adapter.weights, url=str(path))))
        return usable, problems

    async def _offload_problem(self, spec: ShardSpec) -> str:
        """For a llama.cpp shard placed on GPUs: why its layers are not on them ("" when they are)."""
        if not spec.devices or spec.engine != "llama.cpp":
            return ""
        log_bytes = await DISK.run(read_tail, self.log_path(spec.shard_id), abandon=True)
        return offload_problem(log_bytes, spec.devices)

    async def _healthy(self, spec: ShardSpec) -> bool:
        return await engine_http.healthy(self.client, self.host, spec.port, limit_s=self.timing.health_timeout)

    async def _drain(self, shard: _Shard, limit_s: float, exited: trio.Event) -> None:
        with trio.move_on_after(limit_s) as scope:
            while not exited.is_set():
                busy = await engine_http.in_flight(self.client, self.host, shard.spec.port, shard.spec.api_key,
                                                   shard.spec.engine)
                if busy == 0:
                    return
                if busy is None:
                    log.warning("shard %s: cannot see its in-flight requests (/slots and /metrics both "
                                "unavailable); stopping without waiting", shard.spec.shard_id)
                    return
                self._set(shard, ReplicaStatus.DRAINING, f"waiting for {busy} request(s) in flight")
                with trio.move_on_after(self.timing.drain_poll):
                    await exited.wait()
        if scope.cancelled_caught:
            log.warning("shard %s: drain timed out after %g s; stopping with requests in flight",
                        shard.spec.shard_id, limit_s)

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
# heartbeat carries the shards that changed, and RSS wobbles by a few pages all the time.
_MOVED_SHARE = 0.05


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
