"""The admin listener answers only to IP addresses, localhost and admin_hosts: DNS rebinding.

A page whose name was made to resolve to 127.0.0.1 reaches the admin listener with its own name
in Host, and an Origin that matches it (so the origin guard alone lets its POSTs through).
"""

from __future__ import annotations

from typing import Any

import pytest

from llmgw_control.admin.host_guard import AdminHostGuard

from .conftest import Daemon

REBOUND = {"host": "evil.example:8081", "origin": "http://evil.example:8081"}


async def test_a_rebound_page_can_neither_read_nor_make_a_key(daemon: Daemon) -> None:
    refused = await daemon.admin.get("/keys", headers=REBOUND)
    assert refused.status_code == 421
    assert refused.json()["error"]["code"] == "host_not_allowed"
    assert "admin_hosts" in refused.json()["error"]["message"]
    made = await daemon.admin.post("/keys", json={"name": "stolen", "admin": True}, headers=REBOUND)
    assert made.status_code == 421
    assert (await daemon.admin.get("/keys")).json()["keys"] == []


@pytest.mark.parametrize("host", ["127.0.0.1:8081", "localhost:8081", "[::1]:8081", "10.1.2.3"])
async def test_addresses_and_localhost_are_served(daemon: Daemon, host: str) -> None:
    assert (await daemon.admin.get("/keys", headers={"host": host})).status_code == 200


async def test_metrics_and_health_answer_to_any_name(daemon: Daemon) -> None:
    base = daemon.admin_url
    metrics = await daemon.admin.get(f"{base}/metrics", headers={"host": "prometheus-target.example:8081"})
    assert metrics.status_code == 200
    assert (await daemon.admin.get(f"{base}/healthz", headers={"host": "lb.example"})).status_code == 200
    assert (await daemon.admin.get(f"{base}/", headers={"host": "lb.example"})).status_code == 421


async def _call(guard: AdminHostGuard, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await guard(scope, receive, send)
    return sent


async def _inner(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "served"})


@pytest.mark.parametrize(
    ("host", "served"),
    [
        (b"control.mgmt.example:8081", True),
        (b"CONTROL.mgmt.example.", True),
        (b"other.mgmt.example:8081", False),
        (b"127.0.0.1.nip.io", False),
        (b"", False),
        (None, True),  # no Host at all: not a browser, nothing to rebind
    ],
)
async def test_configured_names_are_served_and_no_others(host: bytes | None, served: bool) -> None:
    guard = AdminHostGuard(_inner, ["control.mgmt.example"])
    headers = [] if host is None else [(b"host", host)]
    sent = await _call(guard, {"type": "http", "path": "/api/v1/keys", "headers": headers})
    assert (sent == [{"type": "served"}]) is served
    socket = await _call(guard, {"type": "websocket", "path": "/ws", "headers": headers})
    assert (socket == [{"type": "served"}]) is served
    if not served:
        assert socket == [{"type": "websocket.close", "code": 1008}]


async def test_lifespan_passes_through() -> None:
    assert await _call(AdminHostGuard(_inner), {"type": "lifespan"}) == [{"type": "served"}]
