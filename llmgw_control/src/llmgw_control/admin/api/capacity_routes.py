"""Capacity runs' routes: ``/capacity/runs`` (start, list), ``/capacity/runs/{id}`` (one, cancel)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...api_errors import AdminApiError
from ...fleet.capacity import level_from
from ...fleet.capacity_runs import CapacityRuns, Run
from ..standby_refusal import refuse_on_standby
from .capacity_schemas import CapacityLevelView, CapacityRunAnswer, CapacityRunList, CapacityRunRequest, CapacityRunView
from .core import Api, Call, Param

if TYPE_CHECKING:
    from ...fleet.fleet import Fleet


def run_view(run: Run, objective: tuple[float, float] | None) -> CapacityRunView:
    levels = []
    for doc in run.results:
        level = level_from(doc)
        meets = level.meets(*objective) if objective is not None and any(objective) else None
        levels.append(
            CapacityLevelView(
                level.concurrency,
                level.requests,
                level.errors,
                level.duration_s,
                level.prompt_tokens_per_s,
                level.generation_tokens_per_s,
                level.ttft_p50_s,
                level.ttft_p99_s,
                level.itl_p50_s,
                level.itl_p99_s,
                meets,
            )
        )
    return CapacityRunView(
        run.id,
        run.model,
        run.profile,
        run.node,
        run.state,
        run.error,
        run.created_at,
        run.finished_at,
        list(run.levels),
        len(run.results),
        run.prompt_tokens,
        run.output_tokens,
        run.level_seconds,
        run.node_id,
        run.replica_id,
        run.started_replica,
        levels,
        run.slots,
        dict(run.comparable),
    )


def add_capacity_routes(api: Api, runs: CapacityRuns | None, fleet: Fleet | None = None) -> None:
    def the_runs() -> CapacityRuns:
        if runs is None:
            raise AdminApiError(503, "not_ready", "capacity runs need the control plane on this daemon")
        return runs

    def view(run: Run) -> CapacityRunView:
        resolved = the_runs().catalog.resolve(run.profile_key)
        objective = (resolved.profile.ttft_target, resolved.profile.itl_target) if resolved else None
        return run_view(run, objective)

    @api.route(
        "POST",
        "/capacity/runs",
        summary="Start a capacity run: a sweep of concurrency levels against a replica of a profile",
        tag="capacity",
        body=CapacityRunRequest,
        response=CapacityRunAnswer,
        status=202,
        errors=(404, 409, 503),
    )
    async def start_run(call: Call) -> CapacityRunAnswer:
        # A run takes (or starts) a replica through the reconciler, which only the leader runs.
        refuse_on_standby(fleet, "start capacity runs")
        return CapacityRunAnswer(view(await the_runs().start(call.body)))

    @api.route(
        "GET",
        "/capacity/runs",
        summary="Capacity runs, newest first",
        tag="capacity",
        response=CapacityRunList,
        errors=(503,),
        query=(Param("model", doc="Only this model's runs"), Param("state")),
    )
    async def list_runs(call: Call) -> CapacityRunList:
        # Runs live in the leader's manager; a standby's copy is what it loaded at its start.
        refuse_on_standby(fleet, "list capacity runs")
        model, state = call.query.get("model"), call.query.get("state")
        found = sorted(the_runs().runs.values(), key=lambda r: r.created_at, reverse=True)
        return CapacityRunList(
            [view(r) for r in found if (model is None or r.model == model) and (state is None or r.state == state)]
        )

    @api.route(
        "GET",
        "/capacity/runs/{run_id}",
        summary="One capacity run: state, levels done, results",
        tag="capacity",
        response=CapacityRunAnswer,
        errors=(404, 503),
    )
    async def get_run(call: Call) -> CapacityRunAnswer:
        refuse_on_standby(fleet, "read capacity runs")
        return CapacityRunAnswer(view(the_runs().get(call.path["run_id"])))

    @api.route(
        "DELETE",
        "/capacity/runs/{run_id}",
        summary="Cancel a queued or running capacity run",
        tag="capacity",
        response=CapacityRunAnswer,
        errors=(404, 409, 503),
    )
    async def delete_run(call: Call) -> CapacityRunAnswer:
        refuse_on_standby(fleet, "cancel capacity runs")
        return CapacityRunAnswer(view(await the_runs().cancel(call.path["run_id"])))

    @api.route(
        "POST",
        "/capacity/runs/{run_id}/cancel",
        summary="Cancel a queued or running capacity run",
        tag="capacity",
        response=CapacityRunAnswer,
        errors=(404, 409, 503),
    )
    async def cancel_run(call: Call) -> CapacityRunAnswer:
        refuse_on_standby(fleet, "cancel capacity runs")
        return CapacityRunAnswer(view(await the_runs().cancel(call.path["run_id"])))
