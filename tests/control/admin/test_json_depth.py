"""JSON nested too deep, on every listener of the real daemon: a 400 or a wire error, never a 500 or a dropped node.

Every body route of the admin API is taken from the route table itself, so a route added later is
covered without anyone remembering to add it here.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx2
import pytest
from trio_websocket import open_websocket_url

from llmgw_shared.jsonin import MAX_DEPTH
from llmgw_shared.wire import PROTOCOL_VERSION, Heartbeat, Hello, encode

from .conftest import JOIN_TOKEN, Daemon, fake_node, wait_until

# Past our limit by one, comfortably inside what Python's own parser would accept (it would take
# this body, then fail on it somewhere deeper), and the 100,000 of the report.
DEPTHS = [MAX_DEPTH + 1, 800, 100_000]


def deep(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def admin_body_routes(daemon: Daemon) -> list[tuple[str, str]]:
    from prometheus_client import CollectorRegistry

    from llmgw_control.admin.app import make_admin_app

    api = make_admin_app(CollectorRegistry()).extensions["llmgw.api"]
    routes = [(r.method, re.sub(r"\{[a-z_]+\}", "x", r.path)) for r in api.routes if r.body is not None]
    assert ("POST", "/api/v1/groups") in routes and ("PUT", "/api/v1/groups/x/quota") in routes
    return routes


@pytest.mark.parametrize("levels", DEPTHS)
async def test_every_admin_body_route_refuses_deep_json_with_a_400(daemon: Daemon, levels: int) -> None:
    async with httpx2.AsyncClient(base_url=daemon.admin_url, timeout=20) as client:
        for method, path in admin_body_routes(daemon):
            response = await client.request(
                method, path, content=deep(levels), headers={"content-type": "application/json"}
            )
            assert response.status_code == 400, (method, path, response.text)
            error = response.json()["error"]
            assert error["code"] == "invalid_json", (method, path, error)
            assert f"deeper than {MAX_DEPTH}" in error["message"]
        # Still serving, in the same process.
        assert (await client.get("/healthz")).status_code == 200


@pytest.mark.parametrize("levels", DEPTHS)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
async def test_the_client_api_refuses_deep_json_in_the_openai_shape(daemon: Daemon, path: str, levels: int) -> None:
    body = (
        '{"model": "tiny", "messages": [{"role": "user", "content": ' + deep(levels) + '}], "prompt": "x", '
        '"input": "x"}'
    )
    async with httpx2.AsyncClient(base_url=daemon.listening.api_url, timeout=20) as client:
        response = await client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_json" and error["type"] == "invalid_request_error"
    assert f"deeper than {MAX_DEPTH}" in error["message"]


def hello(node_id: str, **fields: Any) -> dict[str, Any]:
    from llmgw_shared.facts import unprobed

    frame: dict[str, Any] = json.loads(encode(Hello(PROTOCOL_VERSION, node_id, JOIN_TOKEN, unprobed(), [], [])))
    frame.update(fields)
    return frame


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 100_000])
async def test_a_deep_hello_is_refused_with_a_reason(daemon: Daemon, levels: int) -> None:
    text = json.dumps(hello("n-deep"))[:-1] + ', "address": ' + deep(levels) + "}"
    async with open_websocket_url(daemon.agent_url, max_message_size=4 * 1024 * 1024) as ws:
        await ws.send_message(text)
        answer = json.loads(await ws.get_message())
    assert answer["type"] == "refuse", answer
    assert f"deeper than {MAX_DEPTH}" in answer["reason"]
    assert daemon.fleet.inventory.get("n-deep") is None


async def test_a_deep_frame_from_a_joined_node_is_an_error_frame_and_the_session_lives(daemon: Daemon) -> None:
    async with fake_node(daemon, "n-live") as node:
        frame = json.loads(encode(Heartbeat(1)))
        text = json.dumps(frame)[:-1] + ', "shards": ' + deep(100_000) + "}"
        # Sent between the fake node's own heartbeats; its reader records what control answers.
        await node.ws.send_message(text)

        async def told() -> bool:
            return any("deeper than" in e for e in node.errors)

        await wait_until(told)
        # The session went on reading: two more of the node's heartbeats were taken after the error.
        for _ in range(2):
            seen = daemon.fleet.inventory.get("n-live").last_seen  # type: ignore[union-attr]

            async def beat_taken(seen: float = seen) -> bool:
                node_now = daemon.fleet.inventory.get("n-live")
                return node_now is not None and node_now.last_seen > seen

            await wait_until(beat_taken)
        assert "n-live" in daemon.fleet.agents.sessions
        listed = (await daemon.admin.get("/nodes/n-live")).json()["node"]
        assert listed["state"] == "ready", listed
