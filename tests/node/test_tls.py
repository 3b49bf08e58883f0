"""wss:// to control with mutual TLS: certificates made with the openssl command for the test."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio
from trio_websocket import WebSocketRequest, serve_websocket

from llmgw_node.agent import Agent
from llmgw_node.config import ConfigError, NodeConfig
from llmgw_node.service import open_node_service
from llmgw_node.supervisor import Timing
from llmgw_node.tls import client_context
from llmgw_shared.wire import PROTOCOL_VERSION, Hello, Welcome, decode, encode
from support.waiting import wait_until


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.pem"),
    )
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("node-7", "extendedKeyUsage=clientAuth")):
        _openssl(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.csr"),
        )
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            str(d / f"{name}.csr"),
            "-CA",
            str(d / "ca.pem"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            str(d / f"{name}.ext"),
            "-out",
            str(d / f"{name}.pem"),
        )
    return d


@asynccontextmanager
async def mtls_control(pki: Path, seen: list[tuple[str, Hello]]) -> AsyncIterator[str]:
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.pem"))
    server_ctx.load_cert_chain(str(pki / "server.pem"), str(pki / "server.key"))
    server_ctx.verify_mode = ssl.CERT_REQUIRED

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        # The client certificate's common name: what control would take as the node id.
        stream = ws._stream
        cert = stream.getpeercert()  # type: ignore[attr-defined]
        cn = dict(item[0] for item in cert["subject"])["commonName"]
        hello = decode(await ws.get_message())
        assert isinstance(hello, Hello)
        seen.append((cn, hello))
        await ws.send_message(encode(Welcome(protocol_version=PROTOCOL_VERSION, heartbeat_interval_s=1)))
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(serve_websocket, handler, "127.0.0.1", 0, server_ctx))
        yield f"wss://127.0.0.1:{server.port}/agent/v1"
        nursery.cancel_scope.cancel()


async def test_mutual_tls(pki: Path, node_config: NodeConfig, fast_timing: Timing) -> None:
    seen: list[tuple[str, Hello]] = []
    async with mtls_control(pki, seen) as url:
        config = attrs.evolve(
            node_config,
            control=[url],
            tls_ca_file=str(pki / "ca.pem"),
            tls_cert_file=str(pki / "node-7.pem"),
            tls_key_file=str(pki / "node-7.key"),
        )
        async with open_node_service(config, timing=fast_timing) as svc, trio.open_nursery() as nursery:
            agent = Agent(svc, ssl_context=client_context(config))
            nursery.start_soon(agent.run)
            await wait_until(lambda: seen, timeout=10, interval=0.02)
            nursery.cancel_scope.cancel()
    assert seen[0][0] == "node-7" and seen[0][1].node_id == "test-node"


async def test_unknown_server_certificate_is_refused(pki: Path, node_config: NodeConfig, fast_timing: Timing) -> None:
    seen: list[tuple[str, Hello]] = []
    async with mtls_control(pki, seen) as url:
        # No CA configured: the system CAs do not know the test CA, so the handshake must fail.
        config = attrs.evolve(
            node_config,
            control=[url],
            tls_cert_file=str(pki / "node-7.pem"),
            tls_key_file=str(pki / "node-7.key"),
            reconnect_min_s=0.05,
        )
        async with open_node_service(config, timing=fast_timing) as svc, trio.open_nursery() as nursery:
            agent = Agent(svc, ssl_context=client_context(config))
            nursery.start_soon(agent.run)
            await wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in agent.status.last_error, timeout=10, interval=0.02)
            nursery.cancel_scope.cancel()
    assert seen == []


def test_tls_config_mistakes(pki: Path, node_config: NodeConfig) -> None:
    assert client_context(node_config) is None  # no wss:// URL, no context
    missing = attrs.evolve(node_config, control=["wss://h/agent/v1"], tls_ca_file=str(pki / "nope.pem"))
    with pytest.raises(ConfigError, match=r"tls_ca_file: .*/nope\.pem: no such file"):
        client_context(missing)
