"""Mutual TLS on the agent listener: the node id comes from the client certificate."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx2
import pytest
import trio
import trustme
from trio_websocket import HandshakeError, open_websocket_url

from llmgw_control.app import Listening, run_control
from llmgw_control.config import ControlConfig, validate
from llmgw_control.fleet.agents import AgentsConfig
from llmgw_control.fleet.fleet import Fleet
from llmgw_dev.build_engine import archive_name, ensure_engine
from llmgw_dev.served_files import place
from llmgw_node.agent import Agent
from llmgw_node.config import NodeConfig
from llmgw_node.service import open_node_service
from llmgw_node.tls import client_context
from llmgw_shared.facts import unprobed
from llmgw_shared.wire import PROTOCOL_VERSION, Hello, encode
from support.waiting import wait_until


@attrs.frozen
class Pki:
    ca: trustme.CA
    dir: Path

    def client(self, node_id: str) -> tuple[Path, Path]:
        cert = self.ca.issue_cert(node_id, common_name=node_id)
        cert_path, key_path = self.dir / f"{node_id}.pem", self.dir / f"{node_id}.key"
        cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
        cert.private_key_pem.write_to_path(str(key_path))
        return cert_path, key_path

    def client_context(self, node_id: str | None) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if node_id is not None:
            cert, key = self.client(node_id)
            context.load_cert_chain(cert, key)
        return context


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    server.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    return Pki(ca, tmp_path)


@asynccontextmanager
async def tls_control(pki: Pki, files: Path | None = None) -> AsyncIterator[tuple[Listening, Fleet]]:
    d = pki.dir
    agents = AgentsConfig(
        listen="127.0.0.1:0",
        tls_cert_file=str(d / "server.pem"),
        tls_key_file=str(d / "server.key"),
        tls_client_ca_file=str(d / "ca.pem"),
        files_dir=str(files) if files else "",
        heartbeat_interval=0.5,
        unreachable_after=2,
        lost_after=4,
    )
    config = validate(
        ControlConfig(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", data_dir=str(d / "control"), agents=agents)
    )
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(lambda task_status: run_control(config, task_status=task_status))
        assert listening.fleet is not None
        yield listening, listening.fleet
        nursery.cancel_scope.cancel()


def wss(listening: Listening) -> str:
    assert listening.agent_url and listening.agent_url.startswith("https://")
    return listening.agent_url.replace("https://", "wss://") + "/agent/v1"


def hello(node_id: str) -> str:
    return encode(Hello(PROTOCOL_VERSION, node_id, "", attrs.evolve(unprobed(), probed=True), [], []))


async def test_a_node_whose_certificate_names_it_joins(pki: Pki) -> None:
    async with (
        tls_control(pki) as (listening, fleet),
        open_websocket_url(wss(listening), pki.client_context("n1")) as ws,
    ):
        await ws.send_message(hello("n1"))
        assert json.loads(await ws.get_message())["type"] == "welcome"
        assert "n1" in fleet.agents.sessions


async def test_a_certificate_for_another_node_is_refused(pki: Pki) -> None:
    async with (
        tls_control(pki) as (listening, fleet),
        open_websocket_url(wss(listening), pki.client_context("n1")) as ws,
    ):
        await ws.send_message(hello("n2"))
        refusal = json.loads(await ws.get_message())
        assert refusal["type"] == "refuse"
        assert refusal["reason"] == "the client certificate is for node n1, but the hello says n2"
        assert fleet.agents.sessions == {}


@pytest.mark.slow  # left out of the quick tier: waits out TLS handshakes refused
async def test_no_client_certificate_no_connection(pki: Pki) -> None:
    async with tls_control(pki) as (listening, fleet):
        with pytest.raises((HandshakeError, trio.BrokenResourceError, ssl.SSLError, OSError)):
            # With TLS 1.3 the client learns of the refusal only when it reads: bound the wait.
            async with open_websocket_url(wss(listening), pki.client_context(None), connect_timeout=3) as ws:
                await ws.send_message(hello("n1"))
                await ws.get_message()
        assert fleet.agents.sessions == {}
        # Files need a certificate too.
        async with httpx2.AsyncClient(verify=pki.client_context(None)) as client:
            with pytest.raises(httpx2.TransportError):
                await client.get(listening.agent_url + "/healthz")
        async with httpx2.AsyncClient(verify=pki.client_context("n1")) as client:
            assert (await client.get(listening.agent_url + "/healthz")).status_code == 200


@pytest.mark.engine
async def test_a_real_node_installs_its_engine_over_mutual_tls(pki: Pki, llama_server_binary: Path) -> None:
    files = pki.dir / "files"
    (files / "engines").mkdir(parents=True)
    place(ensure_engine(), files / "engines" / archive_name())
    cert, key = pki.client("gpu-1")
    async with tls_control(pki, files) as (listening, fleet):
        node_config = NodeConfig(
            control=[wss(listening)],
            node_id="gpu-1",
            data_dir=str(pki.dir / "node"),
            tls_ca_file=str(pki.dir / "ca.pem"),
            tls_cert_file=str(cert),
            tls_key_file=str(key),
        )
        async with open_node_service(node_config) as svc, trio.open_nursery() as nursery:
            nursery.start_soon(Agent(svc, ssl_context=client_context(node_config)).run)

            def installed() -> bool:
                node = fleet.inventory.get("gpu-1")
                states = [e.status for e in node.engines.values()] if node else []
                if "installed" in states:
                    return True
                assert "failed" not in states, [e.describe() for e in node.engines.values()]  # type: ignore[union-attr]
                return False

            await wait_until(installed, timeout=60, interval=0.1)
            nursery.cancel_scope.cancel()
