"""The agent's way back to a control that went away: a short connect timeout first.

A control that is dying (or restarting) can leave a node's connect in its listen backlog: the
kernel completes the TCP handshake and nobody ever answers the WebSocket upgrade. The first
attempts after a lost connection must give up quickly there, not wait out the full timeout.
"""

from __future__ import annotations

import random

import attrs
import pytest
import trio
import trio_websocket
from node.helpers import receive

from llmgw_node.agent import RECONNECT_CAP_S, RECONNECT_WINDOW_S, Agent, AgentTiming, reconnect_delay
from llmgw_node.config import NodeConfig
from llmgw_node.service import open_node_service
from llmgw_node.supervisor import Timing
from llmgw_shared.wire import PROTOCOL_VERSION, Hello, Welcome, encode


@pytest.mark.slow  # left out of the quick tier: waits out a connect timeout
async def test_after_losing_control_a_connect_into_a_dead_backlog_gives_up_quickly(
    node_config: NodeConfig, fast_timing: Timing
) -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    closed_at: list[float] = []

    async def one_session_then_silence() -> None:
        # The first connection is served: welcome, then close, as a control going away does.
        # Every later one waits in the backlog, never accepted.
        sock, _ = await listener.accept()
        async with trio.open_nursery() as nursery:
            request = await trio_websocket.wrap_server_stream(nursery, trio.SocketStream(sock))
            ws = await request.accept()
            assert isinstance(await receive(ws), Hello)
            await ws.send_message(encode(Welcome(protocol_version=PROTOCOL_VERSION, heartbeat_interval_s=5)))
            await ws.aclose()
            closed_at.append(trio.current_time())

    config = attrs.evolve(
        node_config, control=[f"ws://127.0.0.1:{port}/agent/v1"], reconnect_min_s=0.01, reconnect_max_s=0.02
    )
    with listener:
        async with open_node_service(config, timing=fast_timing) as svc, trio.open_nursery() as nursery:
            nursery.start_soon(one_session_then_silence)
            # The full timeout is 10 s, as in production; the first reconnect gets 1 s (default).
            agent = Agent(svc, timing=AgentTiming(connect_timeout=10.0))
            nursery.start_soon(agent.run)
            with trio.fail_after(8):  # the old agent waited 10 s for the first attempt alone
                while not (closed_at and agent.status.last_error.startswith("could not connect")):
                    await agent.status.changed.wait()
            gave_up_after = trio.current_time() - closed_at[0]
            nursery.cancel_scope.cancel()
    assert gave_up_after < 5, gave_up_after


def test_right_after_losing_control_retries_stay_frequent_then_back_off() -> None:
    """A restarted control is back in seconds: for 30 s after a lost connection the node retries
    at least every 2 s (the plain backoff reached 4-8 s by the fourth round); then as before."""
    rng = random.Random(3)
    for attempt in range(12):
        assert reconnect_delay(attempt, 5.0, 0.5, 30.0, rng) <= RECONNECT_CAP_S
    assert reconnect_delay(10, None, 0.5, 30.0, rng) >= 15  # never welcomed: the full backoff
    assert reconnect_delay(10, RECONNECT_WINDOW_S + 1, 0.5, 30.0, rng) >= 15  # control stayed away
    assert reconnect_delay(0, 5.0, 0.5, 30.0, rng) <= 0.5  # the first retry stays prompt
