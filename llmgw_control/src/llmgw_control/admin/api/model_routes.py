"""The catalog's routes: ``/models`` (every profile with its replicas) and ``/models/{name}`` (one
model's definition: read, add, replace, remove)."""

from __future__ import annotations

from ...catalog import ModelConfig
from ..fleet_views import model_view
from ..standby_refusal import standby_leader
from ..standby_views import read_leader_fleet, standby_model_view
from .context import ApiContext
from .core import Api, Call
from .schemas import ModelDefinition, ModelList


def add_model_routes(api: Api, ctx: ApiContext) -> None:
    @api.route(
        "GET", "/models", summary="Every model profile with its replicas and status", tag="models", response=ModelList
    )
    async def list_models(call: Call) -> ModelList:
        if ctx.fleet is None:
            return ModelList([])
        f = ctx.fleet
        standby, leader = standby_leader(f)
        if standby:
            fleet_of_leader = await read_leader_fleet(ctx.the_tenancy().store, f)
            return ModelList(
                [standby_model_view(f, fleet_of_leader, r) for r in f.catalog.all_profiles()], "standby", leader
            )
        return ModelList([model_view(f, r) for r in f.catalog.all_profiles()])

    @api.route(
        "GET",
        "/models/{name}",
        summary="A model's definition and where it came from",
        tag="models",
        response=ModelDefinition,
        errors=(404, 409, 503),
    )
    async def get_model(call: Call) -> ModelDefinition:
        model, source = ctx.the_models().definition(call.path["name"])
        return ModelDefinition(model, source)

    @api.route(
        "POST",
        "/models",
        summary="Add a model (one [[models]] entry as JSON), persisted in the store",
        tag="models",
        body=ModelConfig,
        response=ModelDefinition,
        status=201,
        errors=(409, 503),
    )
    async def add_model(call: Call) -> ModelDefinition:
        return ModelDefinition(await ctx.the_models().add(call.body), "api")

    @api.route(
        "PUT",
        "/models/{name}",
        summary="Replace a model added through the API",
        tag="models",
        body=ModelConfig,
        response=ModelDefinition,
        errors=(404, 409, 503),
    )
    async def replace_model(call: Call) -> ModelDefinition:
        return ModelDefinition(await ctx.the_models().replace(call.path["name"], call.body), "api")

    @api.route(
        "DELETE",
        "/models/{name}",
        summary="Remove a model added through the API (drains its replicas)",
        tag="models",
        status=204,
        errors=(404, 409, 503),
    )
    async def remove_model(call: Call) -> None:
        await ctx.the_models().remove(call.path["name"])
