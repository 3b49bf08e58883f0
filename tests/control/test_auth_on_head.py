"""Who is asking is settled on a request's head: no body is invited, read or parsed for a client without a key.

And a key restricted to some models sees only those: in /v1/models and in a 404's list.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from llmgw_dev.fake_engine import FakeEngine
from support.control_daemon import control_daemon
from support.gateway import RunningGateway, chat_body, endpoint, running_gateway


async def _with_key(gw: RunningGateway, **key: Any) -> dict[str, str]:
    group = await gw.tenancy.service.create_group("acme")
    created = await gw.tenancy.service.create_key(name="k", group_id=group.id, **key)
    return {"authorization": f"Bearer {created.secret}"}


async def _raw_exchange(url: str, head: bytes, body: bytes = b"") -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = trio.socket.socket()
    await sock.connect((host, int(port)))
    await sock.send(head)
    if body:
        await sock.send(body)
    received = b""
    with trio.fail_after(10):
        while chunk := await sock.recv(65536):
            received += chunk
    sock.close()
    return received


async def test_a_request_without_a_key_is_refused_on_its_head_without_100_continue(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        await _with_key(gw)
        # The client waits for 100 Continue before sending its 30 MB: it must never be invited.
        received = await _raw_exchange(
            gw.url,
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n"
            b"content-type: application/json\r\nexpect: 100-continue\r\n"
            b"content-length: 30000000\r\n\r\n",
        )
        assert received.startswith(b"HTTP/1.1 401 "), received[:200]
        assert b"100 Continue" not in received and b"connection: close" in received
        assert b'"missing_api_key"' in received
        assert fake_engine.observed.requests == []


async def test_a_request_with_a_key_is_invited_to_send_its_body(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        auth = await _with_key(gw)
        async with httpx2.AsyncClient(base_url=gw.url) as client:
            # httpx sends no Expect; the raw exchange below does, with a valid key.
            assert (await client.post("/v1/chat/completions", json=chat_body(), headers=auth)).status_code == 200
        body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
        host, port = gw.url.removeprefix("http://").rsplit(":", 1)
        sock = trio.socket.socket()
        await sock.connect((host, int(port)))
        await sock.send(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"authorization: " + auth["authorization"].encode() + b"\r\nexpect: 100-continue\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        )
        with trio.fail_after(10):
            interim = await sock.recv(65536)
            assert interim.startswith(b"HTTP/1.1 100 "), interim
            await sock.send(body)
            received = b""
            while chunk := await sock.recv(65536):
                received += chunk
        sock.close()
        assert received.startswith(b"HTTP/1.1 200 "), received[:200]


def _send_refused_upload(port: int, size: int, answers: list[bytes]) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % size
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        chunk = b'{"model": "fake", "messages": [' + b" " * 65500
        sent = 0
        try:
            while sent < size:
                part = chunk[: size - sent]
                sock.sendall(part)
                sent += len(part)
        except OSError:
            pass  # the server may stop reading once the upload is past what it lingers for
        received = b""
        while data := sock.recv(65536):
            received += data
        answers.append(received)


@pytest.mark.system  # a control daemon as a process
def test_eight_keyless_30_mb_requests_do_not_grow_the_daemon(tmp_path: Path) -> None:
    # The measurement: eight key-less 30 MB requests took the daemon from 108 to 616 MiB.
    with control_daemon(tmp_path, '[[endpoints]]\nid = "e"\nurl = "http://127.0.0.1:9"\nmodels = ["fake"]\n') as daemon:
        admin = daemon.url("admin")
        group = httpx2.post(f"{admin}/api/v1/groups", json={"name": "acme"}).json()["group"]
        assert httpx2.post(f"{admin}/api/v1/keys", json={"name": "k", "group_id": group["id"]}).status_code == 201
        before = daemon.rss_kib()
        answers: list[bytes] = []
        threads = [
            threading.Thread(target=_send_refused_upload, args=(daemon.ports["api"], 30_000_000, answers))
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        grown_mib = (daemon.rss_kib() - before) / 1024
        assert len(answers) == 8
        assert all(a.startswith(b"HTTP/1.1 401 ") and b"connection: close" in a for a in answers), answers
        assert grown_mib < 48, f"the daemon grew by {grown_mib:.0f} MiB"
        assert daemon.alive()


async def test_a_key_restricted_to_some_models_sees_only_those(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url, "public-a", "secret-b")) as gw:
        restricted = await _with_key(gw, models=["public-a"])
        listed = await gw.client.get("/v1/models", headers=restricted)
        assert [m["id"] for m in listed.json()["data"]] == ["public-a"]
        hidden = await gw.client.get("/v1/models/secret-b", headers=restricted)
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "model_not_found"
        assert "secret-b" not in hidden.json()["error"]["message"].split("Available")[1]
        unknown = await gw.client.post("/v1/chat/completions", json=chat_body("nope"), headers=restricted)
        message = unknown.json()["error"]["message"]
        assert unknown.status_code == 404 and "public-a" in message and "secret-b" not in message
        assert (await gw.client.get("/v1/models/public-a", headers=restricted)).status_code == 200
        # A key without an allow-list still sees every model.
        group = await gw.tenancy.service.create_group("other")
        everything = await gw.tenancy.service.create_key(name="all", group_id=group.id)
        listed = await gw.client.get("/v1/models", headers={"authorization": f"Bearer {everything.secret}"})
        assert sorted(m["id"] for m in listed.json()["data"]) == ["public-a", "secret-b"]
