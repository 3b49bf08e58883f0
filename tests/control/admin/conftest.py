"""Fixtures for the admin API and CLI tests: a control daemon in-process with its fleet, a scripted
node speaking the wire protocol, and PostgreSQL (as in the store suite) for the restart tests."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx2
import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from llmgw_control.app import Listening, run_control
from llmgw_control.catalog import ModelConfig
from llmgw_control.config import ControlConfig, validate
from llmgw_control.fleet.agents import AgentsConfig, token_digest
from llmgw_control.fleet.fleet import Fleet
from llmgw_control.fleet.leadership import LeadershipConfig
from llmgw_control.tenancy.tenancy import Tenancy
from llmgw_shared.config import strict_converter
from llmgw_shared.facts import GpuFacts, unprobed
from llmgw_shared.wire import (
    PROTOCOL_VERSION,
    Ack,
    AssetProvenance,
    DrainReplica,
    EngineProvenance,
    EngineState,
    Error,
    GetReplicaLogs,
    Heartbeat,
    Hello,
    ReplicaLogsReply,
    ReplicaState,
    ReplicaStateReport,
    StartReplica,
    StopReplica,
    WeightsHeld,
    decode,
    encode,
)

# Re-exported: the admin and dashboard tests import it from here.
from support.waiting import wait_until as wait_until

WEIGHTS_SHA = hashlib.sha256(b"weights").hexdigest()
# The fleet is closed, as in production: fake nodes join with this shared token (its digest is in
# the config); a node onboarded through the API uses its own.
JOIN_TOKEN = "llmgw-join-admin-tests"


def model_doc(name: str = "tiny", **profile: Any) -> dict[str, Any]:
    """One [[models]] entry as JSON; the weights path does not exist, so the claim is estimated
    from the size without any network (or set ram_mib to skip the estimate)."""
    return {
        "name": name,
        "profiles": [
            {
                "name": "cpu",
                "weights": {"url": f"/nonexistent/{name}.gguf", "sha256": WEIGHTS_SHA, "size": 1_000_000},
                "context": 256,
                "parallel": 2,
                "ram_mib": 100,
                **profile,
            }
        ],
    }


@attrs.define
class Daemon:
    listening: Listening
    fleet: Fleet
    tenancy: Tenancy
    admin: httpx2.AsyncClient

    @property
    def admin_url(self) -> str:
        return self.listening.admin_url

    @property
    def agent_url(self) -> str:
        assert self.listening.agent_url
        return self.listening.agent_url.replace("http://", "ws://") + "/agent/v1"


@asynccontextmanager
async def running_control(
    data_dir: Path,
    *,
    store: str = "",
    models: list[dict[str, Any]] | None = None,
    control_settings: dict[str, Any] | None = None,
    **agent_settings: Any,
) -> AsyncIterator[Daemon]:
    """``agent_settings`` replace AgentsConfig fields (e.g. ``join_token_digests=[]``: only onboarded nodes),
    ``control_settings`` ControlConfig fields (e.g. ``{"admin_require_key": True}``)."""
    settings: dict[str, Any] = {"join_token_digests": [token_digest(JOIN_TOKEN)], **agent_settings}
    agents = AgentsConfig(
        listen="127.0.0.1:0", heartbeat_interval=0.2, unreachable_after=2.0, lost_after=5.0, **settings
    )
    lead = LeadershipConfig(
        ttl=2.0,
        renew_interval=0.5,
        settle=0.0,
        advertise="ws://127.0.0.1:9/agent/v1" if store.startswith("postgresql") else "",
    )
    # (``control_settings`` may name the listeners: a test that must know the client port beforehand)
    listeners = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", **(control_settings or {})}
    config = validate(
        ControlConfig(
            data_dir=str(data_dir),
            store=store,
            agents=agents,
            leadership=lead,
            shutdown_grace=1.0,
            **listeners,
            models=[strict_converter().structure(m, ModelConfig) for m in models or []],
        )
    )
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(
            lambda task_status: run_control(config, shutdown=shutdown, task_status=task_status)
        )
        assert listening.fleet is not None
        async with httpx2.AsyncClient(base_url=listening.admin_url + "/api/v1", timeout=20) as admin:
            yield Daemon(listening, listening.fleet, listening.tenancy, admin)
        shutdown.set()


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    async with running_control(tmp_path) as d:
        yield d


@attrs.define
class FakeNode:
    """A node that installs nothing and runs nothing, but says it does: starts become ready."""

    node_id: str
    ws: WebSocketConnection
    commands: list[Any] = attrs.Factory(list)
    # The messages of the error frames control sent.
    errors: list[str] = attrs.Factory(list)
    # Each replica's output, as get_shard_logs reads it (the cursor is "1:<lines read>").
    logs: dict[str, list[str]] = attrs.Factory(dict)
    # Starts fail with these last lines instead of becoming ready (None: they become ready).
    fail_with: list[str] | None = None

    def drained(self, replica_id: str) -> bool:
        return any(isinstance(c, DrainReplica) and c.replica_id == replica_id for c in self.commands)

    async def beat(self) -> None:
        for seq in itertools.count(1):
            await self.ws.send_message(encode(Heartbeat(seq)))
            await trio.sleep(0.2)

    async def serve(self) -> None:
        while True:
            message = decode(await self.ws.get_message())
            if isinstance(message, Error):
                self.errors.append(message.message)
            if isinstance(message, GetReplicaLogs):
                self.commands.append(message)
                lines = self.logs.get(message.replica_id)
                after = int(message.cursor.split(":")[1]) if message.cursor else 0
                answer = ReplicaLogsReply(
                    message.id,
                    message.replica_id,
                    lines is not None,
                    (lines or [])[after:][-message.lines :] if lines is not None else [],
                    f"1:{len(lines)}" if lines is not None else "",
                )
                await self.ws.send_message(encode(answer))
            if isinstance(message, StartReplica | DrainReplica | StopReplica):
                self.commands.append(message)
                await self.ws.send_message(encode(Ack(message.id, True)))
                if isinstance(message, StartReplica) and self.fail_with is not None:
                    state = ReplicaState(
                        message.replica.replica_id,
                        "failed",
                        "crashed while starting: exited with status 1",
                        port=message.replica.port,
                        last_lines=self.fail_with,
                    )
                elif isinstance(message, StartReplica):
                    # As a real node: ready with every adapter of its spec loaded, and says which.
                    spec = message.replica
                    state = ReplicaState(
                        spec.replica_id, "ready", port=spec.port, adapters=[a.name for a in spec.adapters]
                    )
                else:
                    state = ReplicaState(message.replica_id, "stopped")
                await self.ws.send_message(encode(ReplicaStateReport(state)))


# What a node's install manifest records for an engine (issue 21), as a real node reports it.
PROVENANCE = EngineProvenance(
    source="http://10.0.0.1:8443/releases/llama.cpp/b11312",
    index_sha256="ab" * 32,
    assets=[
        AssetProvenance(
            "llama-b11312-bin-ubuntu-x64.tar.gz",
            "http://10.0.0.1:8443/files/engines/llama-b11312-bin-ubuntu-x64.tar.gz",
            "cd" * 32,
            6291456,
        )
    ],
    installed_at=1796000000.0,
    signed_by="0123456789ABCDEF",
    control_epoch=3,
)


@asynccontextmanager
async def fake_node(
    daemon: Daemon,
    node_id: str = "n1",
    *,
    warnings: list[str] | None = None,
    token: str = JOIN_TOKEN,
    weights: list[WeightsHeld] | None = None,
    gpus: list[GpuFacts] | None = None,
    degraded: str = "",
) -> AsyncIterator[FakeNode]:
    facts = attrs.evolve(
        unprobed(),
        probed=True,
        hostname=node_id,
        ram_total_mib=8192,
        os_name="Debian",
        arch="x86_64",
        cpu_model="Test CPU",
        cores=4,
        cpu_features=["avx"],
        warnings=warnings or [],
        gpus=gpus or [],
        gpu_backend="cuda" if gpus else "",
        gpu_backends=["cuda"] if gpus else [],
        nvidia_driver="550.54.15" if gpus else None,
        degraded=degraded,
    )
    hello = Hello(
        PROTOCOL_VERSION,
        node_id,
        token,
        facts,
        [EngineState("llama.cpp", "b11312", "installed", provenance=PROVENANCE)],
        [],
        weights=weights or [],
    )
    async with open_websocket_url(daemon.agent_url) as ws, trio.open_nursery() as nursery:
        await ws.send_message(encode(hello))
        assert json.loads(await ws.get_message())["type"] == "welcome"
        node = FakeNode(node_id, ws)
        nursery.start_soon(node.serve)
        nursery.start_soon(node.beat)
        yield node
        nursery.cancel_scope.cancel()


async def first_answer(daemon: Daemon, frame: str) -> dict[str, Any]:
    """What control answers a raw first frame (a hello, or anything pretending to be one)."""
    async with open_websocket_url(daemon.agent_url, max_message_size=4 * 1024 * 1024) as ws:
        await ws.send_message(frame)
        answer: dict[str, Any] = json.loads(await ws.get_message())
        return answer


# --------------------------------------------------------------------------- PostgreSQL

# pg_server and pg_url come from tests/conftest.py.


# The PostgreSQL variant is left out of the quick tier (slow: a fresh database each); the SQLite one
# stays, and so do the tests that take pg_url themselves (test_store_backends, test_leadership).
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store lives: a SQLite file or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    url: str = request.getfixturevalue("pg_url")
    return url
