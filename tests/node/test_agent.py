"""The agent against small trio-websocket servers playing control, on 127.0.0.1."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import pytest
import trio
from node.helpers import fake_control, receive
from trio_websocket import CloseReason, ConnectionClosed, WebSocketConnection

from llmgw_dev.engine_proc import free_port
from llmgw_node.agent import Agent, AgentTiming, SessionEnded, _what_ended, backoff_delay
from llmgw_node.config import ConfiguredEngine, NodeConfig
from llmgw_node.service import open_node_service
from llmgw_node.supervisor import Timing
from llmgw_shared.wire import (
    PROTOCOL_VERSION,
    Ack,
    Error,
    Heartbeat,
    Hello,
    Refuse,
    StopReplica,
    Welcome,
    encode,
)
from support.waiting import wait_until


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    rng = random.Random(7)
    for attempt, base in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (10, 30.0)]:
        delays = [backoff_delay(attempt, 0.5, 30.0, rng) for _ in range(200)]
        assert all(base / 2 <= d <= base for d in delays)
        assert max(delays) - min(delays) > base / 4  # really jittered, so nodes do not stampede


async def test_refusal_names_the_leader_and_the_session_runs_there(
    node_config: NodeConfig, fast_timing: Timing
) -> None:
    hellos: list[Hello] = []
    frames: list[object] = []
    done = trio.Event()

    async def standby(ws: WebSocketConnection) -> None:
        assert isinstance(await receive(ws), Hello)
        await ws.send_message(encode(Refuse(reason="standby", leader=leader_url)))

    async def leader(ws: WebSocketConnection) -> None:
        hello = await receive(ws)
        assert isinstance(hello, Hello)
        hellos.append(hello)
        await ws.send_message(encode(Welcome(protocol_version=PROTOCOL_VERSION, heartbeat_interval_s=0.05)))
        if len(hellos) > 1:
            done.set()
            await trio.sleep_forever()
        await ws.send_message(encode(StopReplica(id="c1", fencing_token=2, replica_id="nothing")))
        await ws.send_message("{not json")
        await ws.send_message(json.dumps({"type": "teleport"}))
        await ws.send_message(encode(StopReplica(id="c2", fencing_token=1, replica_id="nothing")))
        while sum(isinstance(f, Heartbeat) for f in frames) < 3:
            frames.append(await receive(ws))
        await ws.aclose()  # the node must come back

    async with fake_control(leader) as leader_url, fake_control(standby) as standby_url:
        # A long backoff: going to the named leader, and back after a lost session, must not wait.
        config = attrs.evolve(node_config, control=[standby_url], reconnect_min_s=30, reconnect_max_s=30)
        async with open_node_service(config, timing=fast_timing) as svc, trio.open_nursery() as nursery:
            agent = Agent(svc, timing=AgentTiming(connect_timeout=5))
            nursery.start_soon(agent.run)
            with trio.fail_after(10):  # a backoff would be 15-30 s
                await done.wait()
            nursery.cancel_scope.cancel()

    assert agent.status.last_refusal == "standby"
    hello = hellos[0]
    assert (hello.protocol_version, hello.node_id, hello.join_token) == (
        PROTOCOL_VERSION,
        "test-node",
        "llmgw-join-secret",
    )
    assert hello.facts.probed
    acks = [f for f in frames if isinstance(f, Ack)]
    errors = [f.message for f in frames if isinstance(f, Error)]
    assert acks[0] == Ack(command_id="c1", ok=True)
    assert acks[1].command_id == "c2" and not acks[1].ok and "stale fencing token 1" in acks[1].error
    assert errors[0].startswith("bad frame: frame is not valid JSON")
    assert errors[1].startswith("bad frame: unknown message type 'teleport'")
    beats = [f for f in frames if isinstance(f, Heartbeat)]
    assert [b.seq for b in beats] == sorted(b.seq for b in beats)
    # Nothing changed on the node: heartbeats carry nothing but their sequence number.
    assert all(b.facts is None and b.engines == [] and b.replicas == [] for b in beats)
    assert len(hellos) == 2  # reconnected after the close


async def test_unreachable_url_is_skipped(node_config: NodeConfig, fast_timing: Timing) -> None:
    welcomed = trio.Event()

    async def control(ws: WebSocketConnection) -> None:
        await receive(ws)
        await ws.send_message(encode(Welcome(protocol_version=PROTOCOL_VERSION, heartbeat_interval_s=1)))
        welcomed.set()
        await trio.sleep_forever()

    dead = f"ws://127.0.0.1:{free_port()}/agent/v1"
    async with fake_control(control) as live:
        config = attrs.evolve(node_config, control=[dead, live], reconnect_min_s=0.01)
        async with open_node_service(config, timing=fast_timing) as svc, trio.open_nursery() as nursery:
            agent = Agent(svc)
            nursery.start_soon(agent.run)
            with trio.fail_after(10):
                await welcomed.wait()
            nursery.cancel_scope.cancel()
    assert agent.status.last_error.startswith("could not connect")


async def test_hung_control_is_noticed_by_missing_heartbeats(node_config: NodeConfig, fast_timing: Timing) -> None:
    sessions: list[float] = []

    async def hung(ws: WebSocketConnection) -> None:
        await receive(ws)
        sessions.append(trio.current_time())
        await ws.send_message(encode(Welcome(protocol_version=PROTOCOL_VERSION, heartbeat_interval_s=0.1)))
        # Like a stopped process: no frames, no close. (The socket stays open.)
        await trio.sleep_forever()

    async with fake_control(hung) as url:
        config = attrs.evolve(node_config, control=[url], reconnect_min_s=0.01, reconnect_max_s=0.02)
        async with open_node_service(config, timing=fast_timing) as svc, trio.open_nursery() as nursery:
            agent = Agent(svc, timing=AgentTiming(disconnect_timeout=0.2))
            nursery.start_soon(agent.run)
            await wait_until(lambda: len(sessions) >= 2, timeout=10, interval=0.02)
            nursery.cancel_scope.cancel()
    # Three missed 0.1 s heartbeats, a short wait for a close the peer never answers, reconnect.
    assert 0.25 < sessions[1] - sessions[0] < 3.0
    assert "heartbeat missed" in agent.status.last_error


async def test_heartbeat_carries_only_what_changed(
    tmp_path: Path, node_config: NodeConfig, fast_timing: Timing
) -> None:
    script = tmp_path / "engine"
    script.write_text("#!/bin/sh\necho 'tool 1.0'\n")
    script.chmod(0o755)
    config = attrs.evolve(node_config, engines=[ConfiguredEngine(name="tool", path=str(script))])
    async with open_node_service(config, timing=fast_timing) as svc:
        agent = Agent(svc, urls=["ws://127.0.0.1:9/agent/v1"])
        first = agent._heartbeat()
        # Control was never sent anything: everything is news once...
        assert [e.name for e in first.engines] == ["tool"] and first.facts is not None
        # ...and then nothing is.
        second = agent._heartbeat()
        assert (second.seq, second.engines, second.replicas, second.facts) == (first.seq + 1, [], [], None)


@pytest.mark.parametrize("token", ["llmgw-join-supersecret"])
async def test_join_token_never_reaches_the_log(
    node_config: NodeConfig, fast_timing: Timing, caplog: pytest.LogCaptureFixture, token: str
) -> None:
    async def refuse(ws: WebSocketConnection) -> None:
        await receive(ws)
        await ws.send_message(encode(Refuse(reason="bad token")))

    async with fake_control(refuse) as url:
        config = attrs.evolve(node_config, control=[url], token=token, reconnect_min_s=0.01, reconnect_max_s=0.02)
        async with open_node_service(config, timing=fast_timing) as svc, trio.open_nursery() as nursery:
            agent = Agent(svc)
            nursery.start_soon(agent.run)
            await wait_until(lambda: agent.status.last_refusal == "bad token", timeout=10, interval=0.02)
            nursery.cancel_scope.cancel()
    assert "refused this node: bad token" in caplog.text
    assert token not in caplog.text


async def _run_until(
    node_config: NodeConfig, fast_timing: Timing, urls: list[str], hellos: list[float], count: int
) -> None:
    # Backoff 0.5-1.0 s: far above the milliseconds a tight reconnect loop takes, even under load.
    config = attrs.evolve(node_config, control=urls, reconnect_min_s=1.0, reconnect_max_s=1.0)
    async with open_node_service(config, timing=fast_timing) as svc, trio.open_nursery() as nursery:
        nursery.start_soon(Agent(svc).run)
        await wait_until(lambda: len(hellos) >= count, timeout=20, interval=0.01)
        nursery.cancel_scope.cancel()


@pytest.mark.slow  # left out of the quick tier: waits out reconnect backoffs
async def test_standbys_naming_each_other_do_not_bounce_the_node_forever(
    node_config: NodeConfig, fast_timing: Timing
) -> None:
    hellos: list[float] = []

    def standby(name: str) -> Callable[[WebSocketConnection], Awaitable[None]]:
        async def behave(ws: WebSocketConnection) -> None:
            await receive(ws)
            hellos.append(trio.current_time())
            await ws.send_message(encode(Refuse(reason="standby", leader=urls[name])))

        return behave

    urls: dict[str, str] = {}
    async with fake_control(standby("a")) as a, fake_control(standby("b")) as b:
        urls.update(a=b, b=a)  # each names the other as the leader
        await _run_until(node_config, fast_timing, [a], hellos, 7)
    # A round is a, b, a (each redirect followed once), then a backoff: 7 hellos span two of them.
    assert hellos[6] - hellos[0] >= 1.0


@pytest.mark.slow  # left out of the quick tier: waits out reconnect backoffs
async def test_a_control_that_drops_every_session_at_once_gets_backoff(
    node_config: NodeConfig, fast_timing: Timing
) -> None:
    hellos: list[float] = []

    async def drop(ws: WebSocketConnection) -> None:
        await receive(ws)
        hellos.append(trio.current_time())
        await ws.send_message(encode(Welcome(protocol_version=PROTOCOL_VERSION, heartbeat_interval_s=1)))
        await ws.aclose()

    async with fake_control(drop) as url:
        await _run_until(node_config, fast_timing, [url], hellos, 4)
    # The first drop is retried at once; after that each waits a backoff (at least 0.5 s).
    assert hellos[3] - hellos[1] >= 1.0


def test_a_session_that_ends_as_the_node_stops_lets_only_the_stop_go_on_up() -> None:
    closed = ConnectionClosed(CloseReason(1000, None))
    ended = _what_ended(BaseExceptionGroup("tasks", [closed]))
    assert isinstance(ended, SessionEnded) and "connection closed" in str(ended)
    assert str(_what_ended(BaseExceptionGroup("tasks", [SessionEnded("control silent")]))) == "control silent"
    # The node stopping (a cancellation; any other exception stands in for it here) while control
    # drops the session: the session's ending must not ride up with the stop, or the cancel scope
    # that takes the stop out of the group lets the ConnectionClosed escape as an error.
    stop = KeyboardInterrupt()
    rest = _what_ended(BaseExceptionGroup("tasks", [closed, stop]))
    assert isinstance(rest, BaseExceptionGroup) and rest.exceptions == (stop,)
    bug = BaseExceptionGroup("tasks", [ValueError("a bug")])
    assert _what_ended(bug) is bug
