"""API keys' routes: ``/keys`` (list, create) and ``/keys/{id}`` (read, revoke, delete); never a secret but once."""

from __future__ import annotations

from datetime import UTC, datetime

from llmgw_shared.logs import get_logger

from ...store import ApiKey
from .context import ApiContext
from .core import Api, Call, Param
from .schemas import CreatedKeyAnswer, CreateKey, KeyAnswer, KeyList, KeyView

log = get_logger(__name__)


def add_key_routes(api: Api, ctx: ApiContext) -> None:
    def key_view(key: ApiKey) -> KeyView:
        now = datetime.now(UTC)
        state = "active"
        if key.revoked_at is not None and key.revoked_at <= now:
            state = "revoked"
        elif key.expires_at is not None and now >= key.expires_at:
            state = "expired"
        return KeyView(
            key.id,
            key.name,
            key.group_id,
            list(key.models) if key.models is not None else None,
            key.admin,
            key.created_at,
            key.expires_at,
            key.revoked_at,
            state,
        )

    @api.route(
        "GET",
        "/keys",
        summary="API keys (never their secrets)",
        tag="keys",
        response=KeyList,
        errors=(404, 503),
        query=(Param("group_id", doc="Only this group's keys"),),
    )
    async def list_keys(call: Call) -> KeyList:
        group_id = call.query.get("group_id")
        if group_id is not None:
            await ctx.the_tenancy().service.get_group(group_id)  # 404 rather than an empty list
        return KeyList([key_view(k) for k in await ctx.the_tenancy().service.list_keys(group_id)])

    @api.route(
        "POST",
        "/keys",
        summary="Create a key: the answer holds its secret, shown this once",
        tag="keys",
        body=CreateKey,
        response=CreatedKeyAnswer,
        status=201,
        errors=(404, 409, 503),
    )
    async def create_key(call: Call) -> CreatedKeyAnswer:
        body: CreateKey = call.body
        created = await ctx.the_tenancy().service.create_key(
            name=body.name, group_id=body.group_id, models=body.models, admin=body.admin, expires_at=body.expires_at
        )
        log.info("API key %s created through the admin API", created.key.id)
        return CreatedKeyAnswer(key_view(created.key), created.secret)

    @api.route("GET", "/keys/{key_id}", summary="One key", tag="keys", response=KeyAnswer, errors=(404, 503))
    async def get_key(call: Call) -> KeyAnswer:
        return KeyAnswer(key_view(await ctx.the_tenancy().service.get_key(call.path["key_id"])))

    @api.route(
        "POST",
        "/keys/{key_id}/revoke",
        summary="Revoke a key (refused within a second everywhere)",
        tag="keys",
        response=KeyAnswer,
        errors=(404, 409, 503),
    )
    async def revoke_key(call: Call) -> KeyAnswer:
        key = await ctx.the_tenancy().service.revoke_key(call.path["key_id"])
        log.info("API key %s revoked through the admin API", key.id)
        return KeyAnswer(key_view(key))

    @api.route("DELETE", "/keys/{key_id}", summary="Delete a key", tag="keys", status=204, errors=(404, 503))
    async def delete_key(call: Call) -> None:
        await ctx.the_tenancy().service.delete_key(call.path["key_id"])
