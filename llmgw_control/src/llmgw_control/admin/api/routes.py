"""Every route of the admin REST API (``/api/v1``), declared once for the server and the document."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs
import trio

from llmgw_shared.logs import get_logger

from ...api_errors import AdminApiError, conflict, not_found
from ...catalog import ModelConfig
from ...catalog.service import ModelService
from ...store import UNSET, ApiKey, Group, NotFound, Quota, StoreError, Unset
from ..fleet_views import model_view, node_view, node_weights_view, registered_node_view
from ..standby_refusal import refuse_on_standby, standby_leader
from ..standby_views import read_leader_fleet, standby_model_view, standby_node_view, standby_replica_views
from .adapter_routes import add_adapter_routes
from .core import Api, Call, Param
from .replica_logs import register_replica_logs
from .schemas import (
    CapacityList,
    CapacityView,
    CreatedKeyAnswer,
    CreateGroup,
    CreateKey,
    DrainAnswer,
    EngineList,
    EngineNodeState,
    EngineView,
    GroupAnswer,
    GroupList,
    GroupView,
    KeyAnswer,
    KeyList,
    KeyView,
    ModelDefinition,
    ModelList,
    NodeAnswer,
    NodeList,
    NodeView,
    PatchGroup,
    QuotaAnswer,
    QuotaBody,
    QuotaList,
    QuotaView,
    ReplicaList,
    ReplicaView,
    Totals,
    UsageAnswer,
    UsageRow,
    WeightsList,
)

if TYPE_CHECKING:
    from ...fleet.fleet import Fleet
    from ...tenancy.tenancy import Tenancy

log = get_logger(__name__)


@attrs.define
class ApiContext:
    """What the API works on; ``fleet`` is None in router-only mode (no agents listener)."""

    fleet: Fleet | None = None
    tenancy: Tenancy | None = None
    models: ModelService | None = None


def build_api(ctx: ApiContext) -> Api:
    api = Api()

    def fleet() -> Fleet:
        if ctx.fleet is None:
            raise conflict("this control daemon runs without a fleet (agents.listen is not set)", code="no_fleet")
        return ctx.fleet

    def tenancy() -> Tenancy:
        if ctx.tenancy is None:
            raise AdminApiError(503, "not_ready", "tenancy is not available on this daemon")
        return ctx.tenancy

    def models() -> ModelService:
        if ctx.models is None:
            fleet()
            raise AdminApiError(503, "not_ready", "the model catalog is not available on this daemon")
        return ctx.models

    # ------------------------------------------------------------------ nodes

    async def find_node(node_id: str) -> tuple[Fleet, bool]:
        """The fleet and whether the node has a stored identity; 404 when nobody knows it."""
        f = fleet()
        try:
            await tenancy().store.get_node(node_id)
            return f, True
        except NotFound:
            if f.inventory.get(node_id) is None:
                raise not_found("node", node_id) from None
            return f, False

    async def one_node(f: Fleet, node_id: str) -> NodeView:
        node = f.inventory.get(node_id)
        if node is not None:
            return node_view(f, node, trio.current_time())
        return registered_node_view(f, await tenancy().store.get_node(node_id))

    @api.route("GET", "/nodes", summary="The nodes: facts, engine states in the node's words, warnings, shards",
               tag="nodes", response=NodeList)
    async def list_nodes(call: Call) -> NodeList:
        if ctx.fleet is None:
            return NodeList([])
        f = ctx.fleet
        standby, leader = standby_leader(f)
        if standby:
            fleet_of_leader = await read_leader_fleet(tenancy().store, f)
            return NodeList([standby_node_view(fleet_of_leader, n) for n in fleet_of_leader.node_ids],
                            "standby", leader)
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
            fleet_of_leader = await read_leader_fleet(tenancy().store, fleet())
            if node_id not in fleet_of_leader.node_ids:
                raise not_found("node", node_id)
            return NodeAnswer(standby_node_view(fleet_of_leader, node_id))
        f, _ = await find_node(node_id)
        return NodeAnswer(await one_node(f, call.path["node_id"]))

    async def set_cordon(node_id: str, cordoned: bool) -> Fleet:
        f, stored = await find_node(node_id)
        if stored:
            # The store first: if it fails nothing changed, and a restart keeps what it says.
            await tenancy().store.update_node(node_id, cordoned=cordoned)
        if cordoned:
            f.reconciler.cordon(node_id)
        else:
            f.reconciler.uncordon(node_id)
        return f

    @api.route("POST", "/nodes/{node_id}/cordon", summary="Place no new replicas on the node",
               tag="nodes", response=NodeAnswer, errors=(404, 409, 503))
    async def cordon_node(call: Call) -> NodeAnswer:
        node_id = call.path["node_id"]
        refuse_on_standby(ctx.fleet, "cordon")
        f = await set_cordon(node_id, True)
        log.info("node %s cordoned through the admin API", node_id)
        return NodeAnswer(await one_node(f, node_id))

    @api.route("POST", "/nodes/{node_id}/uncordon", summary="Allow new replicas on the node again",
               tag="nodes", response=NodeAnswer, errors=(404, 409, 503))
    async def uncordon_node(call: Call) -> NodeAnswer:
        node_id = call.path["node_id"]
        refuse_on_standby(ctx.fleet, "uncordon")
        f = await set_cordon(node_id, False)
        log.info("node %s uncordoned through the admin API", node_id)
        return NodeAnswer(await one_node(f, node_id))

    @api.route("POST", "/nodes/{node_id}/drain",
               summary="Cordon the node and drain its replicas (withdrawn from the router first)",
               tag="nodes", response=DrainAnswer, errors=(404, 409, 503))
    async def drain_node(call: Call) -> DrainAnswer:
        node_id = call.path["node_id"]
        # A standby runs no replicas and talks to no node: the leader does the draining.
        refuse_on_standby(ctx.fleet, "drain")
        f, _ = await find_node(node_id)
        await set_cordon(node_id, True)
        drained = f.reconciler.drain_node(node_id)
        log.info("node %s drained through the admin API (%d replicas)", node_id, len(drained))
        return DrainAnswer(await one_node(f, node_id), drained)

    # ------------------------------------------------------------------ models

    @api.route("GET", "/models", summary="Every model profile with its replicas and status", tag="models",
               response=ModelList)
    async def list_models(call: Call) -> ModelList:
        if ctx.fleet is None:
            return ModelList([])
        f = ctx.fleet
        standby, leader = standby_leader(f)
        if standby:
            fleet_of_leader = await read_leader_fleet(tenancy().store, f)
            return ModelList([standby_model_view(f, fleet_of_leader, r) for r in f.catalog.all_profiles()],
                             "standby", leader)
        return ModelList([model_view(f, r) for r in f.catalog.all_profiles()])

    @api.route("GET", "/models/{name}", summary="A model's definition and where it came from", tag="models",
               response=ModelDefinition, errors=(404, 409, 503))
    async def get_model(call: Call) -> ModelDefinition:
        model, source = models().definition(call.path["name"])
        return ModelDefinition(model, source)

    @api.route("POST", "/models", summary="Add a model (one [[models]] entry as JSON), persisted in the store",
               tag="models", body=ModelConfig, response=ModelDefinition, status=201, errors=(409, 503))
    async def add_model(call: Call) -> ModelDefinition:
        return ModelDefinition(await models().add(call.body), "api")

    @api.route("PUT", "/models/{name}", summary="Replace a model added through the API", tag="models",
               body=ModelConfig, response=ModelDefinition, errors=(404, 409, 503))
    async def replace_model(call: Call) -> ModelDefinition:
        return ModelDefinition(await models().replace(call.path["name"], call.body), "api")

    @api.route("DELETE", "/models/{name}", summary="Remove a model added through the API (drains its replicas)",
               tag="models", status=204, errors=(404, 409, 503))
    async def remove_model(call: Call) -> None:
        await models().remove(call.path["name"])

    add_adapter_routes(api, ctx.models, ctx.fleet)

    # ------------------------------------------------------------------ replicas, engines

    @api.route("GET", "/replicas", summary="Every replica the reconciler manages", tag="replicas",
               response=ReplicaList)
    async def list_replicas(call: Call) -> ReplicaList:
        if ctx.fleet is None:
            return ReplicaList([])
        f = ctx.fleet
        standby, leader = standby_leader(f)
        if standby:
            return ReplicaList(standby_replica_views(f, await read_leader_fleet(tenancy().store, f)), "standby", leader)
        out = []
        for r in sorted(f.reconciler.shards.values(), key=lambda r: (r.key, r.shard_id)):
            published = f.reconciler.replicas.get(r.shard_id)
            hung = published is not None and published.progress.hung_since is not None
            # Withdrawn by the gateway's hang watch (gateway/hang_watch.py) while its node still
            # reports it ready: not routable, and the detail says why.
            detail = "hung: its engine stopped answering; withdrawn until its /health answers" if hung else r.detail
            out.append(ReplicaView(r.shard_id, r.key, r.node_id, r.port, r.status, detail, r.draining,
                                   published is not None and not hung, published.in_flight if published else 0,
                                   list(r.last_lines), published.slots if published else 0))
        return ReplicaList(out)

    register_replica_logs(api, fleet)

    @api.route("GET", "/engines", summary="The engines every node gets, and their state on each node",
               tag="engines", response=EngineList)
    async def list_engines(call: Call) -> EngineList:
        if ctx.fleet is None:
            return EngineList([])
        f = ctx.fleet
        out = []
        for engine in f.catalog.engines:
            states = []
            for node in f.inventory:
                state = node.engine(engine.name, engine.version)
                states.append(EngineNodeState(node.node_id, state.describe() if state else "not reported",
                                              state.provenance if state else None))
            out.append(EngineView(engine.name, engine.version, engine.release_api, states))
        # A standby has no node reports: the engines are the catalog's, their states the leader's to say.
        standby, leader = standby_leader(f)
        return EngineList(out, "standby", leader) if standby else EngineList(out)

    @api.route("GET", "/weights", summary="The model files each node holds: size, when last used, in use by what",
               tag="nodes", response=WeightsList, errors=(404,),
               query=(Param("node", doc="Only this node"),))
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

    # ------------------------------------------------------------------ groups

    def group_view(group: Group) -> GroupView:
        tree = tenancy().state.tree
        path = tree.path(group.id) if group.id in tree else group.name
        effective = tenancy().state.priority(group.id).label if group.id in tree else group.priority or "interactive"
        return GroupView(group.id, group.name, group.parent_id, path, group.created_at, group.updated_at,
                         group.priority, effective)

    @api.route("GET", "/groups", summary="The group tree", tag="groups", response=GroupList, errors=(503,))
    async def list_groups(call: Call) -> GroupList:
        return GroupList([group_view(g) for g in await tenancy().service.list_groups()])

    @api.route("POST", "/groups", summary="Create a group", tag="groups", body=CreateGroup, response=GroupAnswer,
               status=201, errors=(404, 409, 503))
    async def create_group(call: Call) -> GroupAnswer:
        body: CreateGroup = call.body
        return GroupAnswer(group_view(await tenancy().service.create_group(body.name, body.parent_id,
                                                                           priority=body.priority)))

    @api.route("GET", "/groups/{group_id}", summary="One group", tag="groups", response=GroupAnswer,
               errors=(404, 503))
    async def get_group(call: Call) -> GroupAnswer:
        return GroupAnswer(group_view(await tenancy().service.get_group(call.path["group_id"])))

    @api.route("PATCH", "/groups/{group_id}", summary="Rename, move or set the priority of a group", tag="groups",
               body=PatchGroup, response=GroupAnswer, errors=(404, 409, 503))
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
        group = await tenancy().service.update_group(call.path["group_id"], name=name, parent_id=parent,
                                                     priority=priority)
        return GroupAnswer(group_view(group))

    @api.route("DELETE", "/groups/{group_id}", summary="Delete a group (no children, keys or quota in use)",
               tag="groups", status=204, errors=(404, 409, 503))
    async def delete_group(call: Call) -> None:
        await tenancy().service.delete_group(call.path["group_id"])

    # ------------------------------------------------------------------ keys

    def key_view(key: ApiKey) -> KeyView:
        now = datetime.now(UTC)
        state = "active"
        if key.revoked_at is not None and key.revoked_at <= now:
            state = "revoked"
        elif key.expires_at is not None and now >= key.expires_at:
            state = "expired"
        return KeyView(key.id, key.name, key.group_id, list(key.models) if key.models is not None else None,
                       key.admin, key.created_at, key.expires_at, key.revoked_at, state)

    @api.route("GET", "/keys", summary="API keys (never their secrets)", tag="keys", response=KeyList,
               errors=(404, 503), query=(Param("group_id", doc="Only this group's keys"),))
    async def list_keys(call: Call) -> KeyList:
        group_id = call.query.get("group_id")
        if group_id is not None:
            await tenancy().service.get_group(group_id)  # 404 rather than an empty list
        return KeyList([key_view(k) for k in await tenancy().service.list_keys(group_id)])

    @api.route("POST", "/keys", summary="Create a key: the answer holds its secret, shown this once",
               tag="keys", body=CreateKey, response=CreatedKeyAnswer, status=201, errors=(404, 409, 503))
    async def create_key(call: Call) -> CreatedKeyAnswer:
        body: CreateKey = call.body
        created = await tenancy().service.create_key(name=body.name, group_id=body.group_id, models=body.models,
                                                     admin=body.admin, expires_at=body.expires_at)
        log.info("API key %s created through the admin API", created.key.id)
        return CreatedKeyAnswer(key_view(created.key), created.secret)

    @api.route("GET", "/keys/{key_id}", summary="One key", tag="keys", response=KeyAnswer, errors=(404, 503))
    async def get_key(call: Call) -> KeyAnswer:
        return KeyAnswer(key_view(await tenancy().service.get_key(call.path["key_id"])))

    @api.route("POST", "/keys/{key_id}/revoke", summary="Revoke a key (refused within a second everywhere)",
               tag="keys", response=KeyAnswer, errors=(404, 409, 503))
    async def revoke_key(call: Call) -> KeyAnswer:
        key = await tenancy().service.revoke_key(call.path["key_id"])
        log.info("API key %s revoked through the admin API", key.id)
        return KeyAnswer(key_view(key))

    @api.route("DELETE", "/keys/{key_id}", summary="Delete a key", tag="keys", status=204, errors=(404, 503))
    async def delete_key(call: Call) -> None:
        await tenancy().service.delete_key(call.path["key_id"])

    # ------------------------------------------------------------------ quotas

    def quota_view(group_id: str, quota: Quota) -> QuotaView:
        tree = tenancy().state.tree
        return QuotaView(group_id, tree.path(group_id) if group_id in tree else group_id, quota.requests_per_minute,
                         quota.tokens_per_minute, quota.tokens_per_day, quota.concurrent_requests)

    @api.route("GET", "/quotas", summary="Every group's quota", tag="quotas", response=QuotaList, errors=(503,))
    async def list_quotas(call: Call) -> QuotaList:
        quotas = await tenancy().service.list_quotas()
        return QuotaList([quota_view(g, q) for g, q in sorted(quotas.items())])

    @api.route("GET", "/groups/{group_id}/quota", summary="A group's quota", tag="quotas", response=QuotaAnswer,
               errors=(404, 503))
    async def get_quota(call: Call) -> QuotaAnswer:
        group_id = call.path["group_id"]
        await tenancy().service.get_group(group_id)
        quota = await tenancy().service.get_quota(group_id)
        if quota is None:
            raise not_found("quota of group", group_id)
        return QuotaAnswer(quota_view(group_id, quota))

    @api.route("PUT", "/groups/{group_id}/quota", summary="Set (replace) a group's quota", tag="quotas",
               body=QuotaBody, response=QuotaAnswer, errors=(404, 503))
    async def set_quota(call: Call) -> QuotaAnswer:
        group_id = call.path["group_id"]
        await tenancy().service.get_group(group_id)
        quota = await tenancy().service.set_quota(group_id, attrs.asdict(call.body))
        return QuotaAnswer(quota_view(group_id, quota))

    @api.route("DELETE", "/groups/{group_id}/quota", summary="Remove a group's quota", tag="quotas", status=204,
               errors=(404, 503))
    async def clear_quota(call: Call) -> None:
        group_id = call.path["group_id"]
        await tenancy().service.get_group(group_id)
        if await tenancy().service.get_quota(group_id) is None:
            raise not_found("quota of group", group_id)
        await tenancy().service.delete_quota(group_id)

    # ------------------------------------------------------------------ usage, capacity

    @api.route("GET", "/usage", summary="Hourly usage rows and their totals", tag="usage", response=UsageAnswer,
               errors=(404, 503), query=(
                   Param("group_id", doc="Only this group's usage"),
                   Param("include_descendants", "boolean", doc="With group_id: its descendants' usage too"),
                   Param("key_id"), Param("model"),
                   Param("since", "date-time", doc="From this hour on (rounded down to the hour)"),
                   Param("until", "date-time", doc="Before this time (exclusive)")))
    async def usage(call: Call) -> UsageAnswer:
        q: dict[str, Any] = call.query
        rows = await tenancy().service.query_usage(
            group_id=q.get("group_id"), include_descendants=q.get("include_descendants", False),
            key_id=q.get("key_id"), model=q.get("model"), since=q.get("since"), until=q.get("until"))
        out = [UsageRow(u.hour, u.key_id, u.group_id, u.model, u.requests, u.prompt_tokens, u.completion_tokens)
               for u in sorted(rows, key=lambda u: (u.hour, u.group_id, u.key_id, u.model))]
        totals = Totals(sum(u.requests for u in out), sum(u.prompt_tokens for u in out),
                        sum(u.completion_tokens for u in out))
        return UsageAnswer(out, totals)

    @api.route("GET", "/capacity", summary="Stored benchmark results", tag="capacity", response=CapacityList,
               errors=(503,), query=(Param("model"), Param("profile"), Param("node_id"), Param("engine")))
    async def capacity(call: Call) -> CapacityList:
        records = await tenancy().store.list_capacity(**call.query)
        return CapacityList([CapacityView(r.id, r.model, r.profile, r.node_id, r.engine, r.concurrency,
                                          r.tokens_per_s, r.ttft_p50_s, r.ttft_p99_s, r.measured_at,
                                          dict(r.detail)) for r in records])

    return api
