"""Builds the control daemon from its config and runs every part in one nursery.

Shutdown is one event: the listeners stop accepting, in-flight requests get the configured grace
period, and everything else is cancelled with the nursery.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from prometheus_client import CollectorRegistry

from llmgw_shared.logs import get_logger
from llmgw_shared.wire import EngineSpec

from .admin.admin_auth import AdminKeyGuard, key_required, refuse_without_admin_keys
from .admin.app import make_admin_app, make_metrics_app
from .admin.dashboard import client_dashboard, open_dashboard, register_admin_dashboard
from .admin.host_guard import AdminHostGuard
from .api_errors import admin_error_body, openai_error_body
from .catalog import Catalog
from .catalog.claims import profile_claims
from .catalog.service import ModelService, stored_models
from .config import ControlConfig
from .fleet.agents import AgentService, Role
from .fleet.files import FileServer
from .fleet.inventory import Inventory, Liveness
from .fleet.leadership import (
    Leadership,
    StandbyGate,
    clear_single_daemon_lease,
    new_holder,
)
from .fleet.listener import make_agent_app
from .fleet.metrics import register_fleet_metrics
from .fleet.reconciler import Reconciler
from .fleet.secret import default_data_dir, load_or_create_secret
from .fleet.tls import Identities, serve_tls_front
from .gateway.activator import Activator
from .gateway.client_app import ClientApp
from .gateway.directory import FleetDirectory, ModelDirectory, StaticDirectory
from .gateway.gateway import Gateway
from .gateway.metrics import GatewayMetrics
from .gateway.replicas import Replica, ReplicaSet
from .gateway.upstream import Httpx2Upstream, UpstreamClient
from .onboarding import Onboarding, stored_identity, wheels_dir_for
from .store import KEY_DIGEST_SECRET, SHARD_KEY_SECRET, LeaseKeeper, Store, cluster_secret, is_postgres_url, open_store
from .tenancy.admission import TenancyAdmission
from .tenancy.keys import KeyDigester, load_or_create_server_secret
from .tenancy.service import TenancyService
from .tenancy.state import TenancyState
from .tenancy.usage import UsageAccumulator, UsageFlusher
from .transport.asgi import serve_lifespan
from .transport.serving import serve_asgi
from .transport.tls import ClientTls, TrustedProxies, reload_on_sighup, server_context

log = get_logger("llmgw.control")


@attrs.frozen
class Listening:
    api_url: str
    admin_url: str
    metrics_url: str | None
    agent_url: str | None = None


@attrs.define
class Tenancy:
    """Keys, groups, quotas and usage, for the admin API and tests."""

    store: Store
    state: TenancyState
    usage: UsageAccumulator
    service: TenancyService
    admission: TenancyAdmission


@asynccontextmanager
async def open_tenancy(config: ControlConfig, data_dir: Path) -> AsyncIterator[Tenancy]:
    """The store and, over it, the tenancy state: loaded before the first request is admitted."""
    location = config.store or str(data_dir / "llmgw.db")
    if not is_postgres_url(location):
        await trio.to_thread.run_sync(partial(data_dir.mkdir, parents=True, exist_ok=True))
    async with open_store(location) as store, trio.open_nursery() as nursery:
        if is_postgres_url(location):
            # Every daemon on this database must check the same digests: the secret lives there.
            secret = await cluster_secret(store, KEY_DIGEST_SECRET, data_dir / "key-secret")
        else:
            secret = await trio.to_thread.run_sync(load_or_create_server_secret, data_dir / "key-secret")
        state = TenancyState(store, KeyDigester(secret))
        usage = UsageAccumulator()
        flusher = UsageFlusher(store, usage)
        await nursery.start(state.run)
        await nursery.start(flusher.run)
        if state.open:
            log.warning("no API keys exist: the gateway is open to every request (create a key to close it)")
        try:
            yield Tenancy(store, state, usage, TenancyService(store, state, usage), TenancyAdmission(state, usage))
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                # Usage counted since the last batch is written before the store closes.
                await flusher.flush_once()
            nursery.cancel_scope.cancel()


@attrs.define
class Fleet:
    """The control plane's parts, for the admin API and tests."""

    catalog: Catalog
    inventory: Inventory
    reconciler: Reconciler
    agents: AgentService
    activator: Activator
    files: FileServer | None
    leadership: Leadership | None = None
    onboarding: Onboarding | None = None


def static_replicas(config: ControlConfig) -> ReplicaSet:
    return ReplicaSet(
        Replica(id=e.id, url=e.url, models=frozenset(e.models), weight=e.weight, api_key=e.api_key, slots=e.slots)
        for e in config.endpoints
    )


def _public_url(config: ControlConfig, bound: str) -> str:
    if config.agents.public_url:
        return config.agents.public_url.rstrip("/")
    return bound.rstrip("/")


def data_dir_of(config: ControlConfig) -> Path:
    return Path(config.data_dir) if config.data_dir else default_data_dir()


@asynccontextmanager
async def _for_the_block(task: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    """Run ``task`` while the block runs; cancel it when the block is done."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(task)
        yield
        nursery.cancel_scope.cancel()


def advertised_agent_url(config: ControlConfig, bound: str) -> str:
    """Where nodes reach this daemon's agent endpoint, for the lease (standbys send nodes there)."""
    if config.leadership.advertise:
        return config.leadership.advertise
    base = _public_url(config, bound)
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/agent/v1"


async def _build_fleet(config: ControlConfig, replicas: ReplicaSet, agent_url: str, store: Store) -> Fleet:
    catalog = Catalog(config.models, config.engines, config.router.default_profile)
    # Models added through the admin API; on a name in both, the config file wins (catalog_service).
    for model in stored_models(await store.list_models(), {m.name for m in config.models}, catalog):
        catalog.put(model, "api")
    public_url = _public_url(config, agent_url)
    files = FileServer(Path(config.agents.files_dir), public_url) if config.agents.files_dir else None
    inventory = Inventory()
    liveness = Liveness(config.agents.unreachable_after, config.agents.lost_after)
    if is_postgres_url(config.store):
        # Shard API keys must be the same on every daemon, or a new leader could not talk to the
        # engines it adopts.
        secret = await cluster_secret(store, SHARD_KEY_SECRET, data_dir_of(config) / "control.secret")
    else:
        secret = await trio.to_thread.run_sync(load_or_create_secret, data_dir_of(config))
    claims = await profile_claims(catalog, files)

    def engine_specs() -> list[EngineSpec]:
        return [EngineSpec(e.name, e.version, files.release_api(e) if files else e.release_api)
                for e in config.engines]

    reconciler_box: list[Reconciler] = []

    def on_change() -> None:
        if reconciler_box:
            reconciler_box[0].wake()

    def on_command_failed(node_id: str, command: Any, reason: str) -> None:
        if reconciler_box:
            reconciler_box[0].command_failed(node_id, command, reason)

    def on_command_unsent(node_id: str, command: Any) -> None:
        if reconciler_box:
            reconciler_box[0].command_unsent(node_id, command)

    agents = AgentService(
        inventory, config=config.agents, token_digests=set(config.agents.join_token_digests),
        engines=engine_specs, on_change=on_change, on_command_failed=on_command_failed,
        on_command_unsent=on_command_unsent, role=Role(),
        fencing_token=lambda: reconciler_box[0].fencing_token if reconciler_box else 1,
        stored_identity=stored_identity(store),
    )
    reconciler = Reconciler(catalog, inventory, liveness, agents, replicas, secret=secret, claims=claims,
                            config=config.reconciler)
    reconciler_box.append(reconciler)
    activator = Activator(replicas, config.activator, waiting=reconciler.waiting, wake=reconciler.wake,
                          status=reconciler.status)
    onboarding = Onboarding(store, public_url, advertised_agent_url(config, agent_url),
                            wheels_dir_for(config.agents.files_dir, data_dir_of(config)))
    return Fleet(catalog, inventory, reconciler, agents, activator, files, onboarding=onboarding)


async def _start_agent_listener(
    config: ControlConfig, nursery: trio.Nursery, serve: Any, agent_app: Any, shutdown: trio.Event
) -> tuple[Identities | None, str]:
    """The agent listener, behind our own TLS front when TLS is configured (see fleet/tls.py)."""
    agents = config.agents
    if not agents.tls_cert_file:
        url = await nursery.start(partial(serve, agent_app, agents.listen, name="agents",
                                          websocket_max_message_size=agents.max_frame_bytes))
        return None, str(url)
    context = server_context(agents.tls_cert_file, agents.tls_key_file, agents.tls_client_ca_file)
    identities = Identities(mutual=bool(agents.tls_client_ca_file))
    internal = await nursery.start(partial(serve, agent_app, "127.0.0.1:0", name="agents (behind TLS)",
                                           websocket_max_message_size=agents.max_frame_bytes))
    port = int(str(internal).rsplit(":", 1)[1])
    url = await nursery.start(partial(serve_tls_front, agents.listen, port, context, identities, shutdown=shutdown,
                                      limits=config.listeners, error_body=admin_error_body))
    return identities, str(url)


async def run_control(
    config: ControlConfig,
    *,
    shutdown: trio.Event | None = None,
    registry: CollectorRegistry | None = None,
    upstream: UpstreamClient | None = None,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
    fleet_status: list[Fleet] | None = None,
    tenancy_status: list[Tenancy] | None = None,
) -> None:
    shutdown = shutdown if shutdown is not None else trio.Event()
    registry = registry or CollectorRegistry()
    metrics = GatewayMetrics(registry)
    replicas = static_replicas(config)
    client = upstream or Httpx2Upstream()
    grace = config.shutdown_grace
    # Every listener but the client's answers its own refusals (408, 503) in the admin API's shape.
    serve = partial(serve_asgi, shutdown=shutdown, grace=grace, limits=config.listeners,
                    error_body=admin_error_body)
    try:
        # The upstream's upkeep outlives the listeners' drain (its nursery is left after theirs).
        async with open_tenancy(config, data_dir_of(config)) as tenancy, _for_the_block(client.run), \
                trio.open_nursery() as nursery:
            if tenancy_status is not None:
                tenancy_status.append(tenancy)
            # Before any listener binds: an admin listener off loopback with no admin key to open it.
            refuse_without_admin_keys(config.admin_listen, config.admin_require_key, tenancy.state)
            fleet = None
            models = None
            agent_url = None
            directory: ModelDirectory = StaticDirectory(replicas)
            if config.agents.listen:
                # The agent listener starts first: the public URL of the files it serves goes into
                # the engine specs and weights URLs the fleet hands out.
                agent_app_box: list[Any] = []

                async def agent_app(scope: Any, receive: Any, send: Any) -> None:
                    if scope["type"] == "lifespan":
                        await serve_lifespan(receive, send)
                    else:
                        await agent_app_box[0](scope, receive, send)

                identities, agent_url = await _start_agent_listener(config, nursery, serve, agent_app, shutdown)
                fleet = await _build_fleet(config, replicas, agent_url, tenancy.store)
                # A forgotten replica's per-replica series go with it (bounded /metrics).
                fleet.reconciler.on_replica_forgotten = metrics.forget_replica
                agent_app_box.append(make_agent_app(fleet.agents, fleet.files, identities, onboarding=fleet.onboarding))
                # Read at scrape time from the live objects: nothing is counted on the hot path.
                register_fleet_metrics(registry, fleet)
                directory = FleetDirectory(fleet.catalog, replicas)
                lead = config.leadership
                if not is_postgres_url(config.store):
                    await clear_single_daemon_lease(tenancy.store.lease)
                keeper = LeaseKeeper(tenancy.store.lease, new_holder(), advertised_agent_url(config, agent_url),
                                     ttl=lead.ttl, renew_interval=lead.renew_interval)
                fleet.leadership = Leadership(keeper, fleet.agents, fleet.reconciler, fleet.inventory,
                                              settle=lead.settle, activator=fleet.activator,
                                              memory=tenancy.store)
                # Before the reconciler can run: it restores stored cordons, so nothing is placed
                # on a node an operator cordoned before this restart.
                models = ModelService(fleet.catalog, fleet.reconciler, tenancy.store, fleet.files,
                                      {m.name for m in config.models})
                await nursery.start(models.run)
                # The reconciler runs inside it, only while this daemon leads.
                role = await nursery.start(fleet.leadership.run)
                log.info("leader" if role.leader else "standby",
                         extra={"holder": keeper.holder, "leader": role.leader_address})
                if fleet_status is not None:
                    fleet_status.append(fleet)
            gateway = Gateway(replicas, client, metrics, config.router, directory=directory,
                              activator=fleet.activator if fleet else Activator(replicas, config.activator),
                              admission=tenancy.admission)
            # The dashboard: at / on the admin listener, and at /admin on the client port behind an
            # admin-key login, which is also the only way the client port reaches the admin API.
            dashboard = await open_dashboard(fleet=fleet, tenancy=tenancy, prometheus=config.monitoring.prometheus,
                                             data_dir=data_dir_of(config))
            client_pages = client_dashboard(dashboard, otherwise=gateway)
            client_app: Any = ClientApp(gateway, fallback=client_pages)
            if fleet is not None and fleet.leadership is not None:
                client_app = StandbyGate(client_app, fleet.leadership)
            if config.client_tls.trusted_proxies:
                client_app = TrustedProxies(client_app, config.client_tls.trusted_proxies)
            client_tls = None
            if config.client_tls.cert_file:
                client_tls = ClientTls(config.client_tls.cert_file, config.client_tls.key_file)
            if threading.current_thread() is threading.main_thread():  # (signals reach the main thread only)
                await nursery.start(reload_on_sighup, client_tls, shutdown)
            api_url = await nursery.start(partial(serve, client_app, config.listen, name="api",
                                                  error_body=openai_error_body,
                                                  tls=client_tls.context if client_tls else None))
            admin_app = make_admin_app(registry, fleet, tenancy=tenancy, models=models)
            register_admin_dashboard(admin_app, dashboard)
            client_pages.admin_api = admin_app
            admin_guarded = AdminKeyGuard(admin_app, tenancy.state,
                                          required=key_required(config.admin_listen, config.admin_require_key))
            admin_url = await nursery.start(partial(serve, AdminHostGuard(admin_guarded, config.admin_hosts),
                                                    config.admin_listen, name="admin"))
            metrics_url = None
            if config.metrics_listen:
                metrics_url = await nursery.start(partial(serve, make_metrics_app(registry), config.metrics_listen,
                                                          name="metrics"))
            if not directory.names():
                log.warning("no models or endpoints configured: every request will get 404 model_not_found")
            log.info("llmgw-control ready", extra={"api": api_url, "admin": admin_url, "agents": agent_url,
                                                   "models": directory.names()})
            task_status.started(Listening(api_url, admin_url, metrics_url, agent_url))
            if fleet is not None:
                # The reconciler and agent connections run until the listeners have drained.
                await shutdown.wait()
                if fleet.leadership is not None:
                    # First, so a standby takes over on its next poll while requests here drain.
                    await fleet.leadership.release()
                fleet.agents.close_all("control is shutting down")
                with trio.move_on_after(grace + 1):
                    await fleet.agents.wait_all_closed()
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
