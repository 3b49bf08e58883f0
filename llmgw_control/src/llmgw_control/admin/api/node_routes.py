"""The nodes' routes: ``/nodes`` (list, one) and cordon, uncordon, drain."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from llmgw_shared.logs import get_logger

from ...api_errors import not_found
from ...store import NotFound, StoreError
from ..fleet_views import node_view, registered_node_view
from ..standby_refusal import refuse_on_standby, standby_leader
from ..standby_views import read_leader_fleet, standby_node_view
from .context import ApiContext
from .core import Api, Call
from .schemas import DrainAnswer, NodeAnswer, NodeList, NodeView

if TYPE_CHECKING:
    from ...fleet.fleet import Fleet

log = get_logger(__name__)


async def find_node(ctx: ApiContext, node_id: str) -> tuple[Fleet, bool]:
    """The fleet and whether the node has a stored identity; 404 when nobody knows it."""
    f = ctx.the_fleet()
    try:
        await ctx.the_tenancy().store.get_node(node_id)
        return f, True
    except NotFound:
        if f.inventory.get(node_id) is None:
            raise not_found("node", node_id) from None
        return f, False


async def one_node(ctx: ApiContext, f: Fleet, node_id: str) -> NodeView:
    node = f.inventory.get(node_id)
    if node is not None:
        return node_view(f, node, trio.current_time())
    return registered_node_view(f, await ctx.the_tenancy().store.get_node(node_id))


async def set_cordon(ctx: ApiContext, node_id: str, cordoned: bool) -> Fleet:
    f, stored = await find_node(ctx, node_id)
    if stored:
        # The store first: if it fails nothing changed, and a restart keeps what it says.
        await ctx.the_tenancy().store.update_node(node_id, cordoned=cordoned)
    if cordoned:
        f.reconciler.cordon(node_id)
    else:
        f.reconciler.uncordon(node_id)
    return f


def add_node_routes(api: Api, ctx: ApiContext) -> None:
    @api.route(
        "GET",
        "/nodes",
        summary="The nodes: facts, engine states in the node's words, warnings, replicas",
        tag="nodes",
        response=NodeList,
    )
    async def list_nodes(call: Call) -> NodeList:
        if ctx.fleet is None:
            return NodeList([])
        f = ctx.fleet
        standby, leader = standby_leader(f)
        if standby:
            fleet_of_leader = await read_leader_fleet(ctx.the_tenancy().store, f)
            return NodeList(
                [standby_node_view(fleet_of_leader, n) for n in fleet_of_leader.node_ids], "standby", leader
            )
        now = trio.current_time()
        views = [node_view(f, n, now) for n in f.inventory]
        seen = {v.id for v in views}
        if ctx.tenancy is not None:
            try:
                identities = await ctx.tenancy.store.list_nodes()
            except StoreError as exc:
                # The live nodes are in memory: show them even when the store is down.
                log.warning("could not list node identities: %s", exc)
                identities = []
            views += [registered_node_view(f, i) for i in identities if i.id not in seen]
        return NodeList(sorted(views, key=lambda v: v.id))

    @api.route("GET", "/nodes/{node_id}", summary="One node", tag="nodes", response=NodeAnswer, errors=(404, 409))
    async def get_node(call: Call) -> NodeAnswer:
        node_id = call.path["node_id"]
        standby, _ = standby_leader(ctx.fleet)
        if standby:
            fleet_of_leader = await read_leader_fleet(ctx.the_tenancy().store, ctx.the_fleet())
            if node_id not in fleet_of_leader.node_ids:
                raise not_found("node", node_id)
            return NodeAnswer(standby_node_view(fleet_of_leader, node_id))
        f, _ = await find_node(ctx, node_id)
        return NodeAnswer(await one_node(ctx, f, call.path["node_id"]))

    @api.route(
        "POST",
        "/nodes/{node_id}/cordon",
        summary="Place no new replicas on the node",
        tag="nodes",
        response=NodeAnswer,
        errors=(404, 409, 503),
    )
    async def cordon_node(call: Call) -> NodeAnswer:
        node_id = call.path["node_id"]
        refuse_on_standby(ctx.fleet, "cordon")
        f = await set_cordon(ctx, node_id, True)
        log.info("node %s cordoned through the admin API", node_id)
        return NodeAnswer(await one_node(ctx, f, node_id))

    @api.route(
        "POST",
        "/nodes/{node_id}/uncordon",
        summary="Allow new replicas on the node again",
        tag="nodes",
        response=NodeAnswer,
        errors=(404, 409, 503),
    )
    async def uncordon_node(call: Call) -> NodeAnswer:
        node_id = call.path["node_id"]
        refuse_on_standby(ctx.fleet, "uncordon")
        f = await set_cordon(ctx, node_id, False)
        log.info("node %s uncordoned through the admin API", node_id)
        return NodeAnswer(await one_node(ctx, f, node_id))

    @api.route(
        "POST",
        "/nodes/{node_id}/drain",
        summary="Cordon the node and drain its replicas (withdrawn from the gateway first)",
        tag="nodes",
        response=DrainAnswer,
        errors=(404, 409, 503),
    )
    async def drain_node(call: Call) -> DrainAnswer:
        node_id = call.path["node_id"]
        # A standby runs no replicas and talks to no node: the leader does the draining.
        refuse_on_standby(ctx.fleet, "drain")
        f, _ = await find_node(ctx, node_id)
        await set_cordon(ctx, node_id, True)
        drained = f.reconciler.drain_node(node_id)
        log.info("node %s drained through the admin API (%d replicas)", node_id, len(drained))
        return DrainAnswer(await one_node(ctx, f, node_id), drained)
