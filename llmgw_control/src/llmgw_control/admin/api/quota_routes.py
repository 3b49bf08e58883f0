"""Quotas' routes: ``/quotas`` and ``/groups/{id}/quota`` (read, set, remove)."""

from __future__ import annotations

import attrs

from ...api_errors import not_found
from ...store import Quota
from .context import ApiContext
from .core import Api, Call
from .schemas import QuotaAnswer, QuotaBody, QuotaList, QuotaView


def add_quota_routes(api: Api, ctx: ApiContext) -> None:
    def quota_view(group_id: str, quota: Quota) -> QuotaView:
        tree = ctx.the_tenancy().state.tree
        return QuotaView(
            group_id,
            tree.path(group_id) if group_id in tree else group_id,
            quota.requests_per_minute,
            quota.tokens_per_minute,
            quota.tokens_per_day,
            quota.concurrent_requests,
        )

    @api.route("GET", "/quotas", summary="Every group's quota", tag="quotas", response=QuotaList, errors=(503,))
    async def list_quotas(call: Call) -> QuotaList:
        quotas = await ctx.the_tenancy().service.list_quotas()
        return QuotaList([quota_view(g, q) for g, q in sorted(quotas.items())])

    @api.route(
        "GET",
        "/groups/{group_id}/quota",
        summary="A group's quota",
        tag="quotas",
        response=QuotaAnswer,
        errors=(404, 503),
    )
    async def get_quota(call: Call) -> QuotaAnswer:
        group_id = call.path["group_id"]
        await ctx.the_tenancy().service.get_group(group_id)
        quota = await ctx.the_tenancy().service.get_quota(group_id)
        if quota is None:
            raise not_found("quota of group", group_id)
        return QuotaAnswer(quota_view(group_id, quota))

    @api.route(
        "PUT",
        "/groups/{group_id}/quota",
        summary="Set (replace) a group's quota",
        tag="quotas",
        body=QuotaBody,
        response=QuotaAnswer,
        errors=(404, 503),
    )
    async def set_quota(call: Call) -> QuotaAnswer:
        group_id = call.path["group_id"]
        await ctx.the_tenancy().service.get_group(group_id)
        quota = await ctx.the_tenancy().service.set_quota(group_id, attrs.asdict(call.body))
        return QuotaAnswer(quota_view(group_id, quota))

    @api.route(
        "DELETE",
        "/groups/{group_id}/quota",
        summary="Remove a group's quota",
        tag="quotas",
        status=204,
        errors=(404, 503),
    )
    async def clear_quota(call: Call) -> None:
        group_id = call.path["group_id"]
        await ctx.the_tenancy().service.get_group(group_id)
        if await ctx.the_tenancy().service.get_quota(group_id) is None:
            raise not_found("quota of group", group_id)
        await ctx.the_tenancy().service.delete_quota(group_id)
