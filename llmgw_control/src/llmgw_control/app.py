"""Builds the control daemon from its config and runs every part in one nursery.

Shutdown is one event: the listeners stop accepting, in-flight requests get the configured grace
period, and everything else is cancelled with the nursery.
"""

from __future__ import annotations

import attrs
import trio
from llmgw_shared.logs import get_logger
from prometheus_client import CollectorRegistry

from .admin.app import make_admin_app, make_metrics_app
from .config import ControlConfig
from .metrics import GatewayMetrics
from .router.asgi import ClientApp
from .router.gateway import Gateway
from .router.replicas import Replica, ReplicaSet
from .router.upstream import Httpx2Upstream, UpstreamClient
from .serving import serve_asgi

log = get_logger("llmgw.control")


@attrs.frozen
class Listening:
    api_url: str
    admin_url: str
    metrics_url: str | None


def static_replicas(config: ControlConfig) -> ReplicaSet:
    return ReplicaSet(
        Replica(id=e.id, url=e.url, models=frozenset(e.models), weight=e.weight, api_key=e.api_key)
        for e in config.endpoints
    )


async def run_control(
    config: ControlConfig,
    *,
    shutdown: trio.Event | None = None,
    registry: CollectorRegistry | None = None,
    upstream: UpstreamClient | None = None,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    shutdown = shutdown if shutdown is not None else trio.Event()
    registry = registry or CollectorRegistry()
    metrics = GatewayMetrics(registry)
    replicas = static_replicas(config)
    client = upstream or Httpx2Upstream()
    try:
        gateway = Gateway(replicas, client, metrics, config.router)
        grace = config.shutdown_grace
        async with trio.open_nursery() as nursery:
            api_url = await nursery.start(
                lambda task_status: serve_asgi(ClientApp(gateway), config.listen, shutdown=shutdown, grace=grace,
                                               name="api", task_status=task_status))
            admin_url = await nursery.start(
                lambda task_status: serve_asgi(make_admin_app(registry), config.admin_listen, shutdown=shutdown,
                                               grace=grace, name="admin", task_status=task_status))
            metrics_url = None
            if config.metrics_listen:
                metrics_url = await nursery.start(
                    lambda task_status: serve_asgi(make_metrics_app(registry), config.metrics_listen,
                                                   shutdown=shutdown, grace=grace, name="metrics",
                                                   task_status=task_status))
            if not replicas.models():
                log.warning("no endpoints configured: every request will get 404 model_not_found")
            log.info("llmgw-control ready", extra={"api": api_url, "admin": admin_url,
                                                   "models": replicas.models()})
            task_status.started(Listening(api_url, admin_url, metrics_url))
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
