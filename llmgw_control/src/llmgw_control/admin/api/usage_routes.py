"""What was measured: ``/usage`` (hourly rows and totals) and ``/capacity`` (stored benchmark results)."""

from __future__ import annotations

from typing import Any

from .context import ApiContext
from .core import Api, Call, Param
from .schemas import CapacityList, CapacityView, Totals, UsageAnswer, UsageRow


def add_usage_routes(api: Api, ctx: ApiContext) -> None:
    @api.route(
        "GET",
        "/usage",
        summary="Hourly usage rows and their totals",
        tag="usage",
        response=UsageAnswer,
        errors=(404, 503),
        query=(
            Param("group_id", doc="Only this group's usage"),
            Param("include_descendants", "boolean", doc="With group_id: its descendants' usage too"),
            Param("key_id"),
            Param("model"),
            Param("since", "date-time", doc="From this hour on (rounded down to the hour)"),
            Param("until", "date-time", doc="Before this time (exclusive)"),
        ),
    )
    async def usage(call: Call) -> UsageAnswer:
        q: dict[str, Any] = call.query
        rows = await ctx.the_tenancy().service.query_usage(
            group_id=q.get("group_id"),
            include_descendants=q.get("include_descendants", False),
            key_id=q.get("key_id"),
            model=q.get("model"),
            since=q.get("since"),
            until=q.get("until"),
        )
        out = [
            UsageRow(u.hour, u.key_id, u.group_id, u.model, u.requests, u.prompt_tokens, u.completion_tokens)
            for u in sorted(rows, key=lambda u: (u.hour, u.group_id, u.key_id, u.model))
        ]
        totals = Totals(
            sum(u.requests for u in out), sum(u.prompt_tokens for u in out), sum(u.completion_tokens for u in out)
        )
        return UsageAnswer(out, totals)

    @api.route(
        "GET",
        "/capacity",
        summary="Stored benchmark results",
        tag="capacity",
        response=CapacityList,
        errors=(503,),
        query=(Param("model"), Param("profile"), Param("node_id"), Param("engine")),
    )
    async def capacity(call: Call) -> CapacityList:
        records = await ctx.the_tenancy().store.list_capacity(**call.query)
        return CapacityList(
            [
                CapacityView(
                    r.id,
                    r.model,
                    r.profile,
                    r.node_id,
                    r.engine,
                    r.concurrency,
                    r.tokens_per_s,
                    r.ttft_p50_s,
                    r.ttft_p99_s,
                    r.measured_at,
                    dict(r.detail),
                )
                for r in records
            ]
        )
