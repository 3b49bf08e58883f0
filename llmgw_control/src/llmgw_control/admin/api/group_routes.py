"""The group tree's routes: ``/groups`` (list, create) and ``/groups/{id}`` (read, change, delete)."""

from __future__ import annotations

from ...api_errors import AdminApiError
from ...store import UNSET, Group, Unset
from .context import ApiContext
from .core import Api, Call
from .schemas import CreateGroup, GroupAnswer, GroupList, GroupView, PatchGroup


def add_group_routes(api: Api, ctx: ApiContext) -> None:
    def group_view(group: Group) -> GroupView:
        state = ctx.the_tenancy().state
        tree = state.tree
        path = tree.path(group.id) if group.id in tree else group.name
        effective = state.priority(group.id).label if group.id in tree else group.priority or "interactive"
        return GroupView(
            group.id, group.name, group.parent_id, path, group.created_at, group.updated_at, group.priority, effective
        )

    @api.route("GET", "/groups", summary="The group tree", tag="groups", response=GroupList, errors=(503,))
    async def list_groups(call: Call) -> GroupList:
        return GroupList([group_view(g) for g in await ctx.the_tenancy().service.list_groups()])

    @api.route(
        "POST",
        "/groups",
        summary="Create a group",
        tag="groups",
        body=CreateGroup,
        response=GroupAnswer,
        status=201,
        errors=(404, 409, 503),
    )
    async def create_group(call: Call) -> GroupAnswer:
        body: CreateGroup = call.body
        return GroupAnswer(
            group_view(await ctx.the_tenancy().service.create_group(body.name, body.parent_id, priority=body.priority))
        )

    @api.route("GET", "/groups/{group_id}", summary="One group", tag="groups", response=GroupAnswer, errors=(404, 503))
    async def get_group(call: Call) -> GroupAnswer:
        return GroupAnswer(group_view(await ctx.the_tenancy().service.get_group(call.path["group_id"])))

    @api.route(
        "PATCH",
        "/groups/{group_id}",
        summary="Rename, move or set the priority of a group",
        tag="groups",
        body=PatchGroup,
        response=GroupAnswer,
        errors=(404, 409, 503),
    )
    async def update_group(call: Call) -> GroupAnswer:
        name: str | Unset = UNSET
        parent: str | Unset | None = UNSET
        if "name" in call.raw:
            if call.body.name is None:
                raise AdminApiError(400, "invalid_request", "name: must be a string, not null", "name")
            name = call.body.name
        if "parent_id" in call.raw:
            parent = call.body.parent_id
        priority: str | Unset | None = UNSET
        if "priority" in call.raw:
            priority = call.body.priority
        group = await ctx.the_tenancy().service.update_group(
            call.path["group_id"], name=name, parent_id=parent, priority=priority
        )
        return GroupAnswer(group_view(group))

    @api.route(
        "DELETE",
        "/groups/{group_id}",
        summary="Delete a group (no children, keys or quota in use)",
        tag="groups",
        status=204,
        errors=(404, 409, 503),
    )
    async def delete_group(call: Call) -> None:
        await ctx.the_tenancy().service.delete_group(call.path["group_id"])
