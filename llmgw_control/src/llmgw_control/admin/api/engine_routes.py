"""What the nodes hold: ``/engines`` (each engine's state on each node) and ``/weights`` (model files)."""

from __future__ import annotations

from ...api_errors import not_found
from ..fleet_views import node_weights_view
from ..standby_refusal import refuse_on_standby, standby_leader
from .context import ApiContext
from .core import Api, Call, Param
from .schemas import EngineList, EngineNodeState, EngineView, WeightsList


def add_engine_routes(api: Api, ctx: ApiContext) -> None:
    @api.route(
        "GET",
        "/engines",
        summary="The engines every node gets, and their state on each node",
        tag="engines",
        response=EngineList,
    )
    async def list_engines(call: Call) -> EngineList:
        if ctx.fleet is None:
            return EngineList([])
        f = ctx.fleet
        out = []
        for engine in f.catalog.engines:
            states = []
            for node in f.inventory:
                state = node.engine(engine.name, engine.version)
                states.append(
                    EngineNodeState(
                        node.node_id, state.describe() if state else "not reported", state.provenance if state else None
                    )
                )
            out.append(EngineView(engine.name, engine.version, engine.release_api, states))
        # A standby has no node reports: the engines are the catalog's, their states the leader's to say.
        standby, leader = standby_leader(f)
        return EngineList(out, "standby", leader) if standby else EngineList(out)

    @api.route(
        "GET",
        "/weights",
        summary="The model files each node holds: size, when last used, in use by what",
        tag="nodes",
        response=WeightsList,
        errors=(404,),
        query=(Param("node", doc="Only this node"),),
    )
    async def list_weights(call: Call) -> WeightsList:
        if ctx.fleet is None:
            return WeightsList([])
        f = ctx.fleet
        # What nodes hold is in their reports, which only the leader receives: an empty list would lie.
        refuse_on_standby(f, "list the nodes' weights")
        wanted = call.query.get("node")
        nodes = sorted(f.inventory, key=lambda n: n.node_id)
        if wanted is not None:
            nodes = [n for n in nodes if n.node_id == wanted]
            if not nodes:
                raise not_found("node", wanted)
        return WeightsList([node_weights_view(f, n) for n in nodes])
