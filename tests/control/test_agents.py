"""The agent service over real WebSockets, with a scripted node speaking the wire protocol."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx2
import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from llmgw_control.app import Listening, run_control
from llmgw_control.config import ControlConfig, validate
from llmgw_control.fleet.agents import AgentsConfig, token_digest
from llmgw_control.fleet.fleet import Fleet
from llmgw_control.store import Role
from llmgw_shared.facts import unprobed
from llmgw_shared.wire import PROTOCOL_VERSION, EngineState, Hello, decode, encode
from support.waiting import wait_until

TOKEN = "llmgw-join-test-token"


@attrs.define
class Control:
    listening: Listening
    fleet: Fleet

    @property
    def agent_url(self) -> str:
        assert self.listening.agent_url
        return self.listening.agent_url.replace("http://", "ws://") + "/agent/v1"

    async def nodes(self) -> list[dict[str, Any]]:
        async with httpx2.AsyncClient(base_url=self.listening.admin_url) as client:
            nodes: list[dict[str, Any]] = (await client.get("/api/v1/nodes")).json()["nodes"]
            return nodes


@asynccontextmanager
async def control(tmp_path: Path, **agents: Any) -> AsyncIterator[Control]:
    settings = {
        "listen": "127.0.0.1:0",
        "join_token_digests": [token_digest(TOKEN)],
        "heartbeat_interval": 0.2,
        "unreachable_after": 1.0,
        "lost_after": 3.0,
        "hello_timeout": 1.0,
        **agents,
    }
    config = validate(
        ControlConfig(
            listen="127.0.0.1:0", admin_listen="127.0.0.1:0", data_dir=str(tmp_path), agents=AgentsConfig(**settings)
        )
    )
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(lambda task_status: run_control(config, task_status=task_status))
        assert listening.fleet is not None
        yield Control(listening, listening.fleet)
        nursery.cancel_scope.cancel()


def hello(node_id: str = "n1", token: str = TOKEN, version: int = PROTOCOL_VERSION) -> str:
    facts = attrs.evolve(unprobed(), probed=True, hostname=node_id, ram_total_mib=4096)
    return encode(Hello(version, node_id, token, facts, [EngineState("llama.cpp", "b11312", "absent")], []))


async def receive(ws: WebSocketConnection) -> dict[str, Any]:
    with trio.fail_after(5):
        value: dict[str, Any] = json.loads(await ws.get_message())
        return value


async def joined(ws: WebSocketConnection, node_id: str = "n1") -> None:
    await ws.send_message(hello(node_id))
    assert (await receive(ws))["type"] == "welcome"
    engines = await receive(ws)
    assert engines["type"] == "set_engines" and engines["engines"][0]["version"] == "b11312"


async def test_a_node_joins_and_is_listed(tmp_path: Path) -> None:
    async with control(tmp_path) as ctl, open_websocket_url(ctl.agent_url) as ws:
        await joined(ws)
        (node,) = await ctl.nodes()
        assert node["id"] == "n1" and node["state"] == "ready"
        assert node["engines"] == [{"name": "llama.cpp", "version": "b11312", "state": "absent", "provenance": None}]
        # Control sends its own heartbeats so a node notices a hung control.
        assert (await receive(ws))["type"] == "heartbeat"


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (hello(token="wrong"), "bad join token"),
        (hello(version=99), "protocol version 99 is not supported"),
        ('{"type": "heartbeat", "seq": 1}', "the first frame must be hello"),
        ("not json", "bad hello: frame is not valid JSON"),
        ('{"type": "hello", "node_id": 3}', "bad hello"),
    ],
)
async def test_bad_hellos_are_refused_with_a_reason(tmp_path: Path, frame: str, reason: str) -> None:
    async with control(tmp_path) as ctl, open_websocket_url(ctl.agent_url) as ws:
        await ws.send_message(frame)
        refusal = await receive(ws)
        assert refusal["type"] == "refuse" and reason in refusal["reason"]
        with pytest.raises(ConnectionClosed):
            await receive(ws)
        assert await ctl.nodes() == []


async def test_a_second_connection_claiming_a_connected_node_id_is_refused(tmp_path: Path) -> None:
    async with control(tmp_path) as ctl, open_websocket_url(ctl.agent_url) as first:
        await joined(first)
        async with open_websocket_url(ctl.agent_url) as impostor:
            await impostor.send_message(hello("n1"))
            refusal = await receive(impostor)
            assert refusal["type"] == "refuse" and "already connected" in refusal["reason"]
        assert (await receive(first))["type"] == "heartbeat"  # the real one is untouched


async def test_malformed_frames_get_errors_without_hurting_other_nodes(tmp_path: Path) -> None:
    async with (
        control(tmp_path) as ctl,
        open_websocket_url(ctl.agent_url) as bad,
        open_websocket_url(ctl.agent_url) as good,
    ):
        await joined(bad, "bad")
        await joined(good, "good")
        frames = {
            "{": "not valid JSON",
            '{"type": "teleport"}': "unknown message type 'teleport'",
            '{"type": "ack", "command_id": 5, "ok": true}': "expected a string, got a number @ $(ack).command_id",
        }
        for frame, complaint in frames.items():
            await bad.send_message(frame)
            message = await receive(bad)
            while message["type"] == "heartbeat":
                message = await receive(bad)
            assert message["type"] == "error" and message["message"].startswith("bad frame")
            assert complaint in message["message"]
        # Enough garbage in a row and the node is disconnected; the other stays.
        for _ in range(5):
            await bad.send_message("{")
        with pytest.raises(ConnectionClosed), trio.fail_after(5):
            while True:
                await bad.get_message()
        await good.send_message(encode(decode('{"type": "heartbeat", "seq": 1}')))
        assert (await receive(good))["type"] in ("heartbeat", "set_engines")
        states = {n["id"]: n["state"] for n in await ctl.nodes()}
        assert states["good"] == "ready"


async def test_a_frame_over_the_size_limit_closes_that_connection(tmp_path: Path) -> None:
    async with control(tmp_path, max_frame_bytes=8192) as ctl, open_websocket_url(ctl.agent_url) as ws:
        await joined(ws)
        await ws.send_message('{"type": "error", "message": "' + "x" * 20000 + '"}')
        with pytest.raises(ConnectionClosed) as closed, trio.fail_after(5):
            while True:
                await ws.get_message()
        assert closed.value.reason.code == 1009  # message too big


@pytest.mark.slow  # left out of the quick tier: waits out missed heartbeats
async def test_a_hung_node_is_noticed_by_missing_heartbeats(tmp_path: Path) -> None:
    async with control(tmp_path) as ctl, open_websocket_url(ctl.agent_url) as ws:
        await joined(ws)
        # The node stops sending anything but keeps the connection open (no FIN), as a stopped
        # process or a cut network would.
        await wait_until(lambda: not ctl.fleet.agents.sessions, timeout=5)
        (node,) = await ctl.nodes()
        assert node["state"] in ("unreachable", "disconnected")


@pytest.mark.slow  # left out of the quick tier: ten heartbeats spanning unreachable_after
async def test_heartbeats_keep_a_node_alive_and_carry_changes(tmp_path: Path) -> None:
    async with control(tmp_path) as ctl, open_websocket_url(ctl.agent_url) as ws:
        await joined(ws)
        for seq in range(10):
            engines = (
                [
                    {
                        "name": "llama.cpp",
                        "version": "b11312",
                        "status": "installing",
                        "detail": f"downloading ({seq * 10}%)",
                    }
                ]
                if seq == 5
                else []
            )
            await ws.send_message(json.dumps({"type": "heartbeat", "seq": seq, "engines": engines}))
            # The scenario's heartbeat cadence (not a wait for control): ten beats span longer
            # than unreachable_after, so the node stays ready only because they keep coming.
            await trio.sleep(0.2)
        (node,) = await ctl.nodes()
        assert node["state"] == "ready"
        assert node["engines"][0]["state"] == "installing: downloading (50%)"


@pytest.mark.slow  # left out of the quick tier: waits out the hello timeout
async def test_no_hello_in_time_closes_the_connection(tmp_path: Path) -> None:
    async with control(tmp_path) as ctl, open_websocket_url(ctl.agent_url) as ws:
        with pytest.raises(ConnectionClosed), trio.fail_after(5):
            await ws.get_message()


async def test_a_standby_refuses_and_names_the_leader(tmp_path: Path) -> None:
    async with control(tmp_path) as ctl:
        ctl.fleet.agents.role = Role(leader=False, leader_address="ws://10.1.2.3:8090/agent/v1")
        async with open_websocket_url(ctl.agent_url) as ws:
            await ws.send_message(hello())
            refusal = await receive(ws)
            assert refusal == {
                "type": "refuse",
                "reason": "standby, leader is ws://10.1.2.3:8090/agent/v1",
                "leader": "ws://10.1.2.3:8090/agent/v1",
            }
