"""Running the control daemon in-process for tests: real listeners on 127.0.0.1, port 0."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx2
import trio
from prometheus_client import CollectorRegistry

from llmgw_control.app import Listening, run_control
from llmgw_control.config import ControlConfig, validate
from llmgw_control.gateway.activator import ActivatorConfig
from llmgw_control.gateway.config import GatewayConfig, StaticReplicaConfig
from llmgw_control.gateway.upstream import UpstreamClient
from llmgw_control.tenancy.tenancy import Tenancy
from llmgw_shared.tracing import TracingConfig
from support.waiting import wait_until


@attrs.define
class RunningGateway:
    listening: Listening
    shutdown: trio.Event
    registry: CollectorRegistry
    client: httpx2.AsyncClient
    tenancy: Tenancy

    @property
    def url(self) -> str:
        return self.listening.api_url

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value

    async def settled_metric(self, name: str, labels: dict[str, str] | None = None, *, expect: float) -> float:
        """The metric once it reaches ``expect`` (the access record lands just after the response)."""
        with trio.move_on_after(5):
            await wait_until(lambda: self.metric(name, labels) == expect, timeout=6, interval=0.005)
        return self.metric(name, labels)


def endpoint(
    id: str,
    url: str,
    *models: str,
    weight: float = 1.0,
    api_key: str = "",
    slots: int | None = None,
    engine_slots: int = 0,
) -> StaticReplicaConfig:
    config = StaticReplicaConfig(
        id=id, url=url, models=list(models) or ["fake-model"], weight=weight, api_key=api_key, engine_slots=engine_slots
    )
    return config if slots is None else attrs.evolve(config, slots=slots)


@asynccontextmanager
async def running_gateway(
    *endpoints: StaticReplicaConfig,
    grace: float = 5.0,
    metrics_listen: str = "",
    upstream: UpstreamClient | None = None,
    activator: ActivatorConfig | None = None,
    store: str = "",
    tracing: TracingConfig | None = None,
    **router: Any,
) -> AsyncIterator[RunningGateway]:
    data_dir = tempfile.mkdtemp(prefix="llmgw-control-")
    config = validate(
        ControlConfig(
            listen="127.0.0.1:0",
            admin_listen="127.0.0.1:0",
            metrics_listen=metrics_listen,
            data_dir=data_dir,
            shutdown_grace=grace,
            router=GatewayConfig(**router),
            endpoints=list(endpoints),
            activator=activator or ActivatorConfig(),
            store=store,
            tracing=tracing or TracingConfig(),
        )
    )
    shutdown = trio.Event()
    registry = CollectorRegistry()
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(
            lambda task_status: run_control(
                config, shutdown=shutdown, registry=registry, task_status=task_status, upstream=upstream
            )
        )
        try:
            async with httpx2.AsyncClient(base_url=listening.api_url, timeout=30) as client:
                yield RunningGateway(listening, shutdown, registry, client, listening.tenancy)
        finally:
            nursery.cancel_scope.cancel()
    shutil.rmtree(data_dir, ignore_errors=True)


def chat_body(model: str = "fake-model", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}
