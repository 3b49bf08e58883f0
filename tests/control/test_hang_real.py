"""A hung engine, on the real engine: two llama-server replicas of the tiny model under load through
the gateway, one stopped with SIGSTOP (its process and port stay up, it answers nothing, as a driver
hang or a deadlocked slot would). The gateway finds it hung by its progress and its unanswered
/health, withdraws it within 10 s, moves its waiting requests (a stream under way is continued on
the other replica), and takes it back after SIGCONT once its /health answers again.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from llmgw_dev.engine_proc import LlamaServer, llama_server_process
from support.gateway import RunningGateway, endpoint, running_gateway
from support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# Clients sending at once: enough that requests are on the engine when it stops, few enough for a
# shared two-core machine.
CLIENTS = 4
# How long the load runs with the engine stopped: past the 10 s bound within which it must be out.
STOPPED_FOR = 11.0
# The bounds: withdrawn within 10 s, no request held longer than 12 s.
WITHDRAWN_WITHIN = 10.0
HELD_AT_MOST = 12.0


@pytest.fixture
def tiny_replicas(llama_server_binary: Path, tiny_model: Path) -> Iterator[dict[str, LlamaServer]]:
    with ExitStack() as stack:
        yield {
            name: stack.enter_context(llama_server_process(llama_server_binary, tiny_model, alias="tiny"))
            for name in ("r1", "r2")
        }


async def _one(client: httpx2.AsyncClient, n: int) -> tuple[float, str, str]:
    """One request (every other one a stream): its duration, replica and a problem ('' when none)."""
    body: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": 24,
        "temperature": 0,
        "messages": [{"role": "user", "content": f"Count to ten, please ({n})."}],
    }
    started = time.monotonic()
    if n % 2:
        body["stream"] = True
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            text = (await response.aread()).decode()
        problem = (
            ""
            if response.status_code == 200 and "[DONE]" in text and '"error"' not in text
            else f"{response.status_code}: {text[-300:]}"
        )
    else:
        response = await client.post("/v1/chat/completions", json=body)
        problem = "" if response.status_code == 200 else f"{response.status_code}: {response.text[:300]}"
    return time.monotonic() - started, response.headers.get("x-llmgw-replica", ""), problem


async def _load(gw: RunningGateway, until: float, results: list[tuple[float, str, str]]) -> None:
    async def client_loop(first: int) -> None:
        n = first
        while time.monotonic() < until:
            results.append(await _one(gw.client, n))
            n += CLIENTS

    async with trio.open_nursery() as nursery:
        for i in range(CLIENTS):
            nursery.start_soon(client_loop, i)


async def test_a_stopped_engine_is_withdrawn_its_requests_moved_and_taken_back(
    tiny_replicas: dict[str, LlamaServer],
) -> None:
    victim = tiny_replicas["r1"]
    endpoints = [endpoint(name, server.url, "tiny", slots=4) for name, server in tiny_replicas.items()]
    async with running_gateway(*endpoints, routing="least-loaded") as gw:
        results: list[tuple[float, str, str]] = []
        stopped_at = withdrawn_at = 0.0
        try:
            async with trio.open_nursery() as nursery:
                started = time.monotonic()
                nursery.start_soon(_load, gw, started + 1.5 + STOPPED_FOR, results)
                await trio.sleep(1.5)
                os.kill(victim.pid, signal.SIGSTOP)
                stopped_at = time.monotonic()
                with trio.move_on_after(STOPPED_FOR):
                    await wait_until(
                        lambda: gw.metric("llmgw_replica_hangs_total", {"replica": "r1"}) >= 1, timeout=STOPPED_FOR + 1
                    )
                withdrawn_at = time.monotonic()
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        assert gw.metric("llmgw_replica_hangs_total", {"replica": "r1"}) == 1
        assert withdrawn_at - stopped_at <= WITHDRAWN_WITHIN
        problems = [problem for _, _, problem in results if problem]
        assert problems == [], problems
        held = max(duration for duration, _, _ in results)
        assert held <= HELD_AT_MOST, f"a request was held {held:.1f} s"
        # Requests kept being served while it was out: the load did not stall.
        assert sum(1 for _, replica, _ in results if replica == "r2") > CLIENTS
        assert gw.metric("llmgw_replicas_hung") == 1 or gw.metric("llmgw_replicas_hung") == 0
        # SIGCONT: its /health answers again, and it is back in rotation.
        await wait_until(lambda: gw.metric("llmgw_replicas_hung") == 0, timeout=10, interval=0.1)
        served_by = set()
        with trio.fail_after(30):
            while "r1" not in served_by:
                _, replica, problem = await _one(gw.client, 0)
                assert problem == ""
                served_by.add(replica)
