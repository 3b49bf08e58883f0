"""Capacity runs: sweeps of concurrency levels against a replica, started from the admin API.

``POST /api/v1/capacity/runs`` asks for one (``CapacityRuns.start``, the edge that validates it);
the run waits its turn (``queued``: one run measures at a time, since two at once on one fleet
would measure each other), takes a ready replica of the profile (``ReplicaSource``: an existing
one, or one started for the run and given back after), measures each level
(``capacity_sweep.measure_level``) and ends ``done``, ``failed`` (with the reason) or
``cancelled``. Each run's document is stored on every change, with what makes it comparable:
engine and version, weights digest, profile arguments, the node's facts.

A finished run is learnt by the reconciler's ``CapacityIndex``: from then on, replicas of the
profile on nodes of that capacity kind get the slot count the run measured (see ``capacity``).
Runs stored before a restart are learnt again at start; one cut short by the restart is
``failed``. Every run's task lives in the manager's nursery (``run``), each in its own cancel
scope so ``cancel`` stops one. ``RUN_LIFECYCLE`` is the table; every change goes through its
``move``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Protocol

import attrs
import trio

from llmgw_shared.logs import get_logger
from llmgw_shared.transitions import Lifecycle

from ..api_errors import AdminApiError, bad_request, conflict, not_found
from ..catalog import Catalog, ProfileKey, Resolved
from ..documents import CONVERTER
from ..store import Store, StoreError
from .capacity import CapacityIndex, Measured, capacity_kind, level_from, measured_from, profile_fingerprint, slots_for
from .capacity_sweep import SweepTarget, Workload, measure_level, new_client

log = get_logger(__name__)


class RunState(StrEnum):
    """A capacity run's state (the store keeps the same strings: ``store.ops_capacity.RUN_STATES``)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


RUN_LIFECYCLE = Lifecycle(
    "capacity run",
    RunState,
    start={RunState.QUEUED},
    transitions={
        # FAILED while queued: control stopped before the run's turn came (found when runs are read).
        RunState.QUEUED: {RunState.RUNNING, RunState.FAILED, RunState.CANCELLED},
        RunState.RUNNING: {RunState.DONE, RunState.FAILED, RunState.CANCELLED},
        RunState.DONE: set(),
        RunState.FAILED: set(),
        RunState.CANCELLED: set(),
    },
)
FINISHED = RUN_LIFECYCLE.terminal
# The sweep when a request names none: powers of two, enough to find where a small replica saturates.
DEFAULT_LEVELS = (1, 2, 4, 8)
# A run longer than an hour is a mistake (levels x level_seconds): refused before it starts.
MAX_RUN_SECONDS = 3600.0
# Runs kept in memory (finished ones beyond this are forgotten, oldest first; the store keeps all).
MAX_RUNS = 200
# Seconds a store write at a run's end may take under cancellation (the final state must land).
_SAVE_GRACE = 5.0


class RunFailed(Exception):
    """The run cannot go on; the message is the reason shown to the operator."""


@attrs.frozen
class Acquired:
    """A replica lent to a run: where to send, on which node, whether the run started it."""

    target: SweepTarget
    replica_id: str
    node_id: str
    started: bool


class ReplicaSource(Protocol):
    async def acquire(self, resolved: Resolved, node: str | None) -> Acquired: ...
    def give_back(self, acquired: Acquired) -> None: ...
    def touch(self, acquired: Acquired) -> None: ...
    def has_node(self, node_id: str) -> bool: ...
    def comparable(self, resolved: Resolved, node_id: str) -> dict[str, Any]:
        """Engine and version, weights digest, profile arguments, node facts, hardware."""
        ...


@attrs.define
class Run:
    id: str
    model: str
    profile: str
    node: str | None
    levels: list[int]
    prompt_tokens: int
    output_tokens: int
    level_seconds: float
    # Stored as its string; a document read back names one of RunState's values or is refused.
    state: RunState = attrs.field(default=RunState.QUEUED, converter=RunState)
    error: str = ""
    created_at: float = 0.0
    finished_at: float | None = None
    node_id: str = ""
    replica_id: str = ""
    started_replica: bool = False
    comparable: dict[str, Any] = attrs.Factory(dict)
    results: list[dict[str, Any]] = attrs.Factory(list)
    # The slot count the run implies for its profile's objective (None: no objective, or not done).
    slots: int | None = None
    scope: trio.CancelScope | None = attrs.field(default=None, metadata={"memory": True})

    @property
    def profile_key(self) -> str:
        return str(ProfileKey(self.model, self.profile))

    def document(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in attrs.fields(Run) if not f.metadata.get("memory")}


def run_from_document(doc: dict[str, Any]) -> Run:
    fields = {f.name for f in attrs.fields(Run) if not f.metadata.get("memory")}
    return Run(**{k: v for k, v in doc.items() if k in fields})


class CapacityRuns:
    def __init__(
        self,
        store: Store,
        catalog: Catalog,
        index: CapacityIndex,
        source: ReplicaSource | None,
        *,
        on_learnt: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.index = index
        self.source = source
        self.on_learnt = on_learnt
        self.runs: dict[str, Run] = {}
        self._one_at_a_time = trio.Lock()
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ the task

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Learn the stored runs, then own every run's task until cancelled."""
        await self._load()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def _load(self) -> None:
        try:
            records = await self.store.list_capacity_runs(limit=10_000)
        except StoreError as exc:
            log.warning("the stored capacity runs could not be read (%s): starting with none", exc)
            return
        for record in reversed(records):  # oldest first: the newest of a kind is learnt last
            try:
                run = run_from_document(dict(record.document))
            except (TypeError, ValueError):
                log.warning("stored capacity run %s could not be read; it is ignored", record.id)
                continue
            if run.state not in FINISHED:
                run.state = RUN_LIFECYCLE.move(run.id, run.state, RunState.FAILED)
                run.error = "control stopped during the run"
                await self._save(run)
            if run.state == RunState.DONE:
                self._learn(run)
            self.runs[run.id] = run
        self._forget_old()
        if self.index:
            self.on_learnt()

    def _learn(self, run: Run) -> None:
        measured = measured_from(run.profile_key, {"comparable": run.comparable, "results": run.results})
        if measured is not None:
            self.index.learn(measured)

    # ------------------------------------------------------------------ API operations

    async def start(self, body: Any) -> Run:
        """A new run from the API body (structured and range-checked by the admin API)."""
        if self._nursery is None:
            raise AdminApiError(503, "not_ready", "capacity runs are starting")
        if self.source is None:
            raise conflict("capacity runs need the control plane (models and nodes), not static replicas")
        resolved = self._resolve(body.model, body.profile)
        levels = sorted(set(body.levels)) if body.levels is not None else list(DEFAULT_LEVELS)
        if not levels:
            raise bad_request("levels", "must name at least one concurrency level")
        if len(levels) * body.level_seconds > MAX_RUN_SECONDS:
            raise bad_request("level_seconds", f"levels x level_seconds must be at most {MAX_RUN_SECONDS:.0f} s")
        if body.prompt_tokens + body.output_tokens > resolved.profile.context:
            raise bad_request(
                "prompt_tokens",
                f"prompt_tokens + output_tokens must fit the profile's context ({resolved.profile.context})",
            )
        if body.node is not None and not self.source.has_node(body.node):
            raise not_found("node", body.node, field="node")
        run = Run(
            secrets.token_hex(8),
            resolved.model.name,
            resolved.profile.name,
            body.node,
            levels,
            body.prompt_tokens,
            body.output_tokens,
            body.level_seconds,
            created_at=time.time(),
        )
        self.runs[run.id] = run
        self._forget_old()
        await self._save(run, new=True)
        self._nursery.start_soon(self._measure, run, resolved)
        log.info("capacity run %s of %s queued (levels %s)", run.id, run.profile_key, levels)
        return run

    def _resolve(self, model: str, profile: str | None) -> Resolved:
        profile_key = ProfileKey.parse(model)
        name, named = (profile_key.model, profile_key.profile) if profile_key is not None else (model, "")
        if named and profile is not None and named != profile:
            raise bad_request("profile", f"the model names profile {named!r}, the body {profile!r}")
        requested = str(ProfileKey(name, profile or named)) if (profile or named) else name
        resolved = self.catalog.resolve(requested)
        if resolved is None:
            raise not_found("model", requested, field="model")
        return resolved

    def get(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            raise not_found("capacity run", run_id)
        return run

    async def cancel(self, run_id: str) -> Run:
        run = self.get(run_id)
        if run.state in FINISHED:
            raise conflict(f"capacity run {run_id} is {run.state} already")
        run.state, run.finished_at = RUN_LIFECYCLE.move(run.id, run.state, RunState.CANCELLED), time.time()
        if run.scope is not None:
            run.scope.cancel()
        await self._save(run)
        log.info("capacity run %s of %s cancelled", run.id, run.profile_key)
        return run

    # ------------------------------------------------------------------ one run

    async def _measure(self, run: Run, resolved: Resolved) -> None:
        assert self.source is not None
        with trio.CancelScope() as scope:
            run.scope = scope
            async with self._one_at_a_time:
                if run.state != RunState.QUEUED:
                    return  # cancelled while it waited
                run.state = RUN_LIFECYCLE.move(run.id, run.state, RunState.RUNNING)
                await self._save(run)
                try:
                    await self._sweep(run, resolved, self.source)
                except RunFailed as exc:
                    _end(run, RunState.FAILED, str(exc))
                except Exception as exc:
                    # A bug must end this run, not the manager and every other run with it.
                    log.exception("capacity run %s failed", run.id)
                    _end(run, RunState.FAILED, f"internal error: {type(exc).__name__}")
                else:
                    _end(run, RunState.DONE)
                    run.slots = slots_for(
                        [level_from(r) for r in run.results], resolved.profile.ttft_target, resolved.profile.itl_target
                    )
                    self._learn(run)
                    self.on_learnt()
        if scope.cancelled_caught:
            _end(run, RunState.CANCELLED)
        run.finished_at = run.finished_at or time.time()
        with trio.CancelScope(shield=True), trio.move_on_after(_SAVE_GRACE):
            await self._save(run)
        log.info(
            "capacity run %s of %s %s%s", run.id, run.profile_key, run.state, f": {run.error}" if run.error else ""
        )

    async def _sweep(self, run: Run, resolved: Resolved, source: ReplicaSource) -> None:
        acquired = await source.acquire(resolved, run.node)
        try:
            run.node_id, run.replica_id, run.started_replica = acquired.node_id, acquired.replica_id, acquired.started
            run.comparable = source.comparable(resolved, acquired.node_id)
            await self._save(run)
            workload = Workload(run.prompt_tokens, run.output_tokens, run.level_seconds)
            async with new_client(max(run.levels)) as client:
                for concurrency in run.levels:
                    result, error = await measure_level(
                        client, acquired.target, workload, concurrency, on_done=lambda: source.touch(acquired)
                    )
                    run.results.append(attrs.asdict(result))
                    await self._save(run)
                    if result.requests == 0:
                        raise RunFailed(f"no request at concurrency {concurrency} succeeded: {error}")
        finally:
            source.give_back(acquired)

    # ------------------------------------------------------------------ the store

    async def _save(self, run: Run, *, new: bool = False) -> None:
        kind = run.comparable.get("kind", "") if run.comparable else ""
        try:
            if new:
                record = await self.store.add_capacity_run(
                    model=run.model, profile=run.profile, node_id=run.node or "", kind="", state=run.state, document={}
                )
                # The store names it: the run takes the stored id, so a restart finds the same run.
                self.runs.pop(run.id, None)
                run.id = record.id
                self.runs[run.id] = run
            await self.store.update_capacity_run(
                run.id,
                state=run.state,
                document=CONVERTER.unstructure(run.document()),
                node_id=run.node_id or run.node or "",
                kind=str(kind),
            )
        except StoreError as exc:
            if new:
                self.runs.pop(run.id, None)
                raise AdminApiError(503, "store_unavailable", f"the run could not be stored: {exc}") from None
            log.warning("capacity run %s could not be stored (%s): kept in memory", run.id, exc)

    def _forget_old(self) -> None:
        finished = [r for r in self.runs.values() if r.state in FINISHED]
        for run in sorted(finished, key=lambda r: r.created_at)[: max(0, len(self.runs) - MAX_RUNS)]:
            del self.runs[run.id]


def _end(run: Run, state: RunState, error: str = "") -> None:
    """End a running run, unless ``cancel`` ended it first (its word stands)."""
    if run.state == RunState.CANCELLED:
        return
    run.state = RUN_LIFECYCLE.move(run.id, run.state, state)
    run.error = error or run.error


def comparable_facts(
    resolved: Resolved, engine_version: str, reported_version: str, facts: Any, hardware: str
) -> dict[str, Any]:
    """What makes a run comparable with another (stored with it, shown side by side)."""
    profile = resolved.profile
    return {
        "engine": profile.engine,
        "engine_version": engine_version,
        "engine_reported_version": reported_version,
        "weights_sha256": profile.weights.sha256 if profile.weights is not None else "",
        "model_dir": profile.model_dir,
        "profile": CONVERTER.unstructure(profile),
        "profile_fingerprint": profile_fingerprint(profile),
        "node": {
            "cpu_model": facts.cpu_model,
            "cores": facts.cores,
            "arch": facts.arch,
            "cpu_features": list(facts.cpu_features),
            "ram_total_mib": facts.ram_total_mib,
            "nvidia_driver": facts.nvidia_driver,
            "os": f"{facts.os_name} {facts.os_version}".strip(),
            "kernel": facts.kernel,
            "gpus": [{"index": g.index, "name": g.name, "memory_total_mib": g.memory_total_mib} for g in facts.gpus],
        },
        "hardware": hardware,
        "kind": capacity_kind(hardware, profile.engine, engine_version),
    }


__all__ = ["Acquired", "CapacityRuns", "Measured", "ReplicaSource", "Run", "RunFailed", "comparable_facts"]
