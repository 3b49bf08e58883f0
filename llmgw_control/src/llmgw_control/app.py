"""Builds the control daemon from its config and runs every part in one nursery.

``run_control`` is a few builders in order, each returning what the next needs: the tenancy (the
store under it), the agent listener's sockets (bound first: their URL goes into what the fleet
hands nodes), the fleet, the gateway, and the client, admin and metrics listeners. Once they are
up, the caller is handed ``Listening``: the bound URLs and the live parts.

Shutdown is one event: the listeners stop accepting, in-flight requests get the configured grace
period, and everything else is cancelled with the nursery.

About 560 lines: this is the one place the daemon's parts meet, in build order; split across
files, the order every part depends on would have to be read from several.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw_shared.logs import get_logger
from llmgw_shared.threads import DISK
from llmgw_shared.tracing import Tracing, open_tracing
from llmgw_shared.wire import EngineSpec

from .admin.admin_auth import AdminKeyGuard, key_required, refuse_without_admin_keys
from .admin.app import make_admin_app, make_metrics_app
from .admin.audit_log import AuditLog
from .admin.dashboard import SessionRevocations, client_dashboard, open_dashboard, register_admin_dashboard
from .admin.host_guard import AdminHostGuard
from .admin.sso import open_sso
from .api_errors import admin_error_body, openai_error_body
from .catalog import Catalog
from .catalog.claims import profile_claims
from .catalog.service import ModelService, stored_models
from .config import ControlConfig
from .fleet.agents import AgentService
from .fleet.capacity_replicas import FleetReplicas
from .fleet.capacity_runs import CapacityRuns
from .fleet.events import NodeEvents
from .fleet.files import FileServer
from .fleet.fleet import Fleet
from .fleet.inventory import Inventory, Liveness
from .fleet.leadership import Leadership, StandbyGate, clear_single_daemon_lease, new_holder
from .fleet.listener import make_agent_app
from .fleet.metrics import register_fleet_metrics
from .fleet.node_release import releases_dir_for
from .fleet.onboarding import Onboarding, stored_identity
from .fleet.reconciler import Reconciler
from .fleet.secret import default_data_dir, load_or_create_secret
from .fleet.tls import Identities, bind_tls_front, serve_tls_front
from .gateway.activator import Activator
from .gateway.client_app import ClientApp
from .gateway.demand import WaitingRequests
from .gateway.directory import FleetDirectory, ModelDirectory, StaticDirectory
from .gateway.gateway import Gateway
from .gateway.metrics import GatewayMetrics
from .gateway.replicas import Replica, ReplicaSet
from .gateway.upstream import Httpx2Upstream, UpstreamClient
from .mirror.hub import Hub
from .mirror.net_guard import NetGuard
from .mirror.pulls import Pulls
from .mirror.service import Mirror
from .store import REPLICA_KEY_SECRET, LeaseKeeper, Store, cluster_secret, is_postgres_url
from .store.transactions import register_transaction_metrics
from .tenancy.tenancy import Tenancy, open_tenancy, quotas_shared
from .transport.asgi import Receive, Scope, Send, serve_lifespan
from .transport.serving import bind, bound_url, serve_asgi
from .transport.tls import ClientTls, TrustedProxies, reload_on_sighup, server_context

log = get_logger(__name__)

# Serve one listener until shutdown (``serve_asgi`` with the daemon's shutdown, grace and limits).
Serve = Callable[..., Awaitable[None]]


@attrs.frozen
class Listening:
    """What ``run_control`` hands its starter once every listener is up: the URLs, and the live
    parts (the tenancy, and the fleet when ``agents.listen`` is set) for embedders and tests."""

    api_url: str
    admin_url: str
    metrics_url: str | None
    agent_url: str | None
    tenancy: Tenancy
    fleet: Fleet | None


def static_replicas(config: ControlConfig) -> ReplicaSet:
    return ReplicaSet(
        Replica(
            id=e.id,
            url=e.url,
            models=frozenset(e.models),
            weight=e.weight,
            api_key=e.api_key,
            slots=e.slots,
            engine_slots=e.engine_slots,
        )
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


async def _until_shutdown(task: Callable[[], Awaitable[None]], shutdown: trio.Event) -> None:
    """Run ``task`` until ``shutdown`` is set."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(task)
        await shutdown.wait()
        nursery.cancel_scope.cancel()


def advertised_agent_url(config: ControlConfig, bound: str) -> str:
    """Where nodes reach this daemon's agent endpoint, for the lease (standbys send nodes there)."""
    if config.leadership.advertise:
        return config.leadership.advertise
    base = _public_url(config, bound)
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/agent/v1"


# --------------------------------------------------------------------------- the agent listener


@attrs.frozen
class AgentSockets:
    """The agent listener, bound before the fleet is built; behind our own TLS front when TLS is
    configured (see fleet/tls.py), the app's sockets are then a loopback port the front relays to."""

    url: str
    app_sockets: list[socket.socket]
    front: list[trio.SocketListener] | None = None
    context: Any = None
    identities: Identities | None = None


async def bind_agents(config: ControlConfig) -> AgentSockets:
    agents = config.agents
    if not agents.tls_cert_file:
        sockets = bind(agents.listen)
        return AgentSockets(bound_url(sockets, tls=False), sockets)
    # The certificate files first: a bad one is refused before anything is bound.
    context = server_context(agents.tls_cert_file, agents.tls_key_file, agents.tls_client_ca_file)
    internal = bind("127.0.0.1:0")
    front, url = await bind_tls_front(agents.listen)
    return AgentSockets(url, internal, front, context, Identities(mutual=bool(agents.tls_client_ca_file)))


async def serve_agents(
    config: ControlConfig, nursery: trio.Nursery, serve: Serve, bound: AgentSockets, fleet: Fleet, shutdown: trio.Event
) -> None:
    """Serve the agent app (nodes' WebSockets, files, the install script) on the bound sockets."""
    agent_app: Any = make_agent_app(fleet.agents, fleet.files, bound.identities, onboarding=fleet.onboarding)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
        else:
            await agent_app(scope, receive, send)

    name = "agents" if bound.front is None else "agents (behind TLS)"
    await nursery.start(
        partial(serve, app, bound.app_sockets, name=name, websocket_max_message_size=config.agents.max_frame_bytes)
    )
    if bound.front is not None and bound.identities is not None:
        port = bound.app_sockets[0].getsockname()[1]
        await nursery.start(
            partial(
                serve_tls_front,
                bound.front,
                bound.url,
                port,
                bound.context,
                bound.identities,
                shutdown=shutdown,
                limits=config.listeners,
                error_body=admin_error_body,
            )
        )


# --------------------------------------------------------------------------- the fleet


async def build_fleet(
    config: ControlConfig,
    replicas: ReplicaSet,
    agent_url: str,
    store: Store,
    metrics: GatewayMetrics,
    demand: WaitingRequests,
    *,
    worker: int | None = None,
) -> Fleet:
    """The control plane's parts, wired to each other; nothing runs yet (``start_fleet``)."""
    catalog = Catalog(config.models, config.engines, config.router.default_profile)
    # Models added through the admin API; on a name in both, the config file wins (catalog/service.py).
    for model in stored_models(await store.list_models(), {m.name for m in config.models}, catalog):
        catalog.put(model, "api")
    public_url = _public_url(config, agent_url)
    files = FileServer(Path(config.agents.files_dir), public_url) if config.agents.files_dir else None
    inventory = Inventory()
    liveness = Liveness(config.agents.unreachable_after, config.agents.lost_after)
    if is_postgres_url(config.store):
        # Replica API keys must be the same on every daemon, or a new leader could not talk to the
        # engines it adopts.
        secret = await cluster_secret(store, REPLICA_KEY_SECRET, data_dir_of(config) / "control.secret")
    else:
        secret = await DISK.run(load_or_create_secret, data_dir_of(config))
    claims = await profile_claims(catalog, files)

    def engine_specs() -> list[EngineSpec]:
        return [EngineSpec(e.name, e.version, files.release_api(e) if files else e.release_api) for e in config.engines]

    # The agent service reports to the reconciler, which sends through it: both get this first.
    events = NodeEvents()
    agents = AgentService(
        inventory,
        config=config.agents,
        token_digests=set(config.agents.join_token_digests),
        engines=engine_specs,
        events=events,
        stored_identity=stored_identity(store),
    )
    # A forgotten replica's per-replica series go with it (bounded /metrics).
    # The activator counts the requests waiting per profile key; the reconciler reads them (demand).
    reconciler = Reconciler(
        catalog,
        inventory,
        liveness,
        agents,
        replicas,
        secret=secret,
        claims=claims,
        config=config.reconciler,
        events=events,
        on_replica_forgotten=metrics.forget_replica,
        demand=demand,
    )
    activator = Activator(replicas, config.activator, demand=demand, wake=reconciler.wake, status=reconciler.status)
    onboarding = Onboarding(
        store,
        public_url,
        advertised_agent_url(config, agent_url),
        releases_dir_for(config.agents.files_dir, data_dir_of(config)),
    )
    if not is_postgres_url(config.store) and worker is None:
        # (Workers share the file: their supervisor cleared it once; a restarted worker must not
        # clear the lease of the worker that leads.)
        await clear_single_daemon_lease(store.lease)
    lead = config.leadership
    keeper = LeaseKeeper(
        store.lease,
        new_holder(),
        advertised_agent_url(config, agent_url),
        ttl=lead.ttl,
        renew_interval=lead.renew_interval,
    )
    leadership = Leadership(
        keeper,
        agents,
        reconciler,
        inventory,
        settle=lead.settle,
        activator=activator,
        memory=store,
        view=store if lead.standby_serves else None,
    )
    models = ModelService(catalog, reconciler, store, files, {m.name for m in config.models})
    capacity = CapacityRuns(
        store, catalog, reconciler.capacity, FleetReplicas(reconciler, activator, inventory), on_learnt=reconciler.wake
    )
    return Fleet(
        catalog,
        inventory,
        reconciler,
        agents,
        activator,
        files,
        leadership=leadership,
        onboarding=onboarding,
        models=models,
        capacity=capacity,
    )


def build_mirror(config: ControlConfig, store: Store, fleet: Fleet | None) -> Mirror:
    """The Hub client; pulls too when there is a files directory for nodes to fetch them from."""
    hub = Hub(config.hub)
    pulls = None
    if fleet is not None and fleet.files is not None:
        pulls = Pulls(
            hub,
            NetGuard(config.hub),
            fleet.files.root / "models",
            fleet.files.public_url,
            store,
            fleet.models,
            config.hub.max_concurrent_pulls,
        )
    return Mirror(hub, pulls)


async def start_fleet(nursery: trio.Nursery, fleet: Fleet) -> None:
    """The model follower, then leadership (the reconciler runs inside it, only while leading)."""
    assert fleet.models is not None and fleet.leadership is not None
    # Before the reconciler can run: it restores stored cordons, so nothing is placed on a node an
    # operator cordoned before this restart.
    await nursery.start(fleet.models.run)
    if fleet.capacity is not None:
        # Before the reconciler: the stored runs' slot counts hold from its first pass.
        await nursery.start(fleet.capacity.run)
    role = await nursery.start(fleet.leadership.run)
    log.info(
        "leader" if role.leader else "standby",
        extra={"holder": fleet.leadership.keeper.holder, "leader": role.leader_address},
    )


async def stop_fleet(fleet: Fleet, grace: float) -> None:
    """After the listeners drained: give the lease up, then close the nodes' connections."""
    if fleet.leadership is not None:
        # First, so a standby takes over on its next poll while requests here drain.
        await fleet.leadership.give_up()
    fleet.agents.close_all("control is shutting down")
    with trio.move_on_after(grace + 1):
        await fleet.agents.wait_all_closed()


# --------------------------------------------------------------------------- the listeners


def build_gateway(
    config: ControlConfig,
    replicas: ReplicaSet,
    client: UpstreamClient,
    metrics: GatewayMetrics,
    demand: WaitingRequests,
    fleet: Fleet | None,
    tenancy: Tenancy,
) -> Gateway:
    directory: ModelDirectory = FleetDirectory(fleet.catalog, replicas) if fleet else StaticDirectory(replicas)
    if not directory.names():
        log.warning("no models or endpoints configured: every request will get 404 model_not_found")
    return Gateway(
        replicas,
        client,
        metrics,
        config.router,
        directory=directory,
        activator=fleet.activator if fleet else Activator(replicas, config.activator, demand=demand),
        admission=tenancy.admission,
    )


async def serve_client_and_admin(
    config: ControlConfig,
    nursery: trio.Nursery,
    serve: Serve,
    shutdown: trio.Event,
    registry: CollectorRegistry,
    gateway: Gateway,
    fleet: Fleet | None,
    tenancy: Tenancy,
    mirror: Mirror | None = None,
    *,
    shared_port: bool = False,
) -> tuple[str, str, str | None]:
    """The client, admin and metrics listeners; their URLs."""
    # The dashboard: at / on the admin listener, and at /admin on the client port behind an
    # admin-key login, which is also the only way the client port reaches the admin API.
    audit = AuditLog(tenancy.store, config.audit)
    # Upkeep, not a listener: it ends with the shutdown (without a fleet nothing cancels the nursery).
    nursery.start_soon(_until_shutdown, audit.run, shutdown)
    # Dashboard sessions ended on the server: read once now, then kept fresh (revocations.py).
    sessions = SessionRevocations(tenancy.store)
    await sessions.refresh_or_log()
    nursery.start_soon(_until_shutdown, sessions.run, shutdown)
    dashboard = await open_dashboard(
        fleet=fleet,
        tenancy=tenancy,
        prometheus=config.monitoring.prometheus,
        data_dir=data_dir_of(config),
        audit=audit,
        sso=open_sso(config.oidc),
        revocations=sessions,
    )
    admin_app = make_admin_app(
        registry,
        fleet,
        tenancy=tenancy,
        models=fleet.models if fleet else None,
        mirror=mirror,
        audit=audit,
        live=gateway.metrics.live,
        sessions=sessions,
    )
    register_admin_dashboard(admin_app, dashboard)
    client_app: Any = ClientApp(gateway, fallback=client_dashboard(dashboard, admin_app, otherwise=gateway))
    if fleet is not None and fleet.leadership is not None:
        client_app = StandbyGate(client_app, fleet.leadership, serves=config.leadership.standby_serves)
    if config.client_tls.trusted_proxies:
        client_app = TrustedProxies(client_app, config.client_tls.trusted_proxies)
    client_tls = None
    if config.client_tls.cert_file:
        client_tls = ClientTls(config.client_tls.cert_file, config.client_tls.key_file)
    if threading.current_thread() is threading.main_thread():  # (signals reach the main thread only)
        await nursery.start(reload_on_sighup, client_tls, shutdown)
    # A worker shares the client port with its siblings (SO_REUSEPORT, see workers.py).
    client_address = bind(config.listen, reuse_port=True) if shared_port else config.listen
    api_url = await nursery.start(
        partial(
            serve,
            client_app,
            client_address,
            name="api",
            error_body=openai_error_body,
            tls=client_tls.context if client_tls else None,
        )
    )
    admin_guarded = AdminKeyGuard(
        admin_app, tenancy.state, required=key_required(config.admin_listen, config.admin_require_key), audit=audit
    )
    admin_url = await nursery.start(
        partial(serve, AdminHostGuard(admin_guarded, config.admin_hosts), config.admin_listen, name="admin")
    )
    metrics_url = None
    if config.metrics_listen:
        metrics_url = await nursery.start(
            partial(serve, make_metrics_app(registry), config.metrics_listen, name="metrics")
        )
    return str(api_url), str(admin_url), str(metrics_url) if metrics_url else None


class _TracingCollector(Collector):
    """Spans the export queue had no room for, read at scrape time (llmgw_shared/tracing.py)."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "llmgw_trace_spans_dropped",
            "Finished spans dropped because the export queue was full (the collector slow or down)",
            value=self.tracing.processor.dropped,
        )


# --------------------------------------------------------------------------- the daemon


async def run_control(
    config: ControlConfig,
    *,
    shutdown: trio.Event | None = None,
    registry: CollectorRegistry | None = None,
    upstream: UpstreamClient | None = None,
    worker: int | None = None,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until ``shutdown`` is set; ``started`` with ``Listening`` once it serves.

    ``worker``: this daemon is that worker of a ``workers = N`` supervisor (workers.py).
    """
    shutdown = shutdown if shutdown is not None else trio.Event()
    registry = registry or CollectorRegistry()
    # Requests waiting per profile key: counted by the activator, read by the reconciler and the
    # live window; built first so each gets it in its constructor.
    demand = WaitingRequests()
    metrics = GatewayMetrics(registry, demand)
    replicas = static_replicas(config)
    client = upstream or Httpx2Upstream(on_resend=metrics.stale_resends.inc)
    grace = config.shutdown_grace
    # Every listener but the client's answers its own refusals (408, 503) in the admin API's shape.
    serve = partial(serve_asgi, shutdown=shutdown, grace=grace, limits=config.listeners, error_body=admin_error_body)
    data_dir = data_dir_of(config)
    location = config.store or str(data_dir / "llmgw.db")
    # Workers are several daemons on one store: each one's quotas count what all of them admit.
    shared = quotas_shared(location, worker=worker is not None)
    try:
        # The upstream's upkeep outlives the listeners' drain (its nursery is left after theirs).
        # Tracing is current for everything below (its last spans are flushed after the drain).
        async with (
            open_tracing(config.tracing, "llmgw-control") as tracing,
            open_tenancy(location, data_dir, shared=shared) as tenancy,
            _for_the_block(client.run),
            trio.open_nursery() as nursery,
        ):
            registry.register(_TracingCollector(tracing))
            # Before any listener binds: an admin listener off loopback with no admin key to open it.
            refuse_without_admin_keys(config.admin_listen, config.admin_require_key, tenancy.state)
            register_transaction_metrics(registry, tenancy.store)
            fleet = None
            agent_url = None
            if config.agents.listen:
                agent_sockets = await bind_agents(config)
                agent_url = agent_sockets.url
                fleet = await build_fleet(config, replicas, agent_url, tenancy.store, metrics, demand, worker=worker)
                await serve_agents(config, nursery, serve, agent_sockets, fleet, shutdown)
                # Read at scrape time from the live objects: nothing is counted on the hot path.
                register_fleet_metrics(registry, fleet)
                await start_fleet(nursery, fleet)
            mirror = build_mirror(config, tenancy.store, fleet)
            if mirror.pulls is not None:
                await nursery.start(mirror.pulls.run)
            gateway = build_gateway(config, replicas, client, metrics, demand, fleet, tenancy)
            # The gateway's hang watch (gateway/hang_watch.py) ends with the shutdown, as the listeners do.
            nursery.start_soon(_until_shutdown, gateway.hangs.run, shutdown)
            api_url, admin_url, metrics_url = await serve_client_and_admin(
                config,
                nursery,
                serve,
                shutdown,
                registry,
                gateway,
                fleet,
                tenancy,
                mirror,
                shared_port=worker is not None,
            )
            log.info(
                "llmgw-control ready",
                extra={"api": api_url, "admin": admin_url, "agents": agent_url, "models": gateway.directory.names()},
            )
            task_status.started(Listening(api_url, admin_url, metrics_url, agent_url, tenancy, fleet))
            if fleet is not None:
                # The reconciler and agent connections run until the listeners have drained.
                await shutdown.wait()
                await stop_fleet(fleet, grace)
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
