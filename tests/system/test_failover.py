"""Failover: two control daemons sharing a real PostgreSQL, nodes and the real engine, as processes.

TTL 2 s and renew 0.5 s (see ``support.failover.FAST_LEADERSHIP``) keep the file short; the
bounds asserted are the ones an operator is promised for any TTL: a killed leader is replaced
within TTL + 1 s, a leader stopped with SIGTERM within a second, and a leader cut off from its
database steps down before its lease can lapse.
"""

from __future__ import annotations

import itertools
import signal
import time
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import trio

from llmgw_dev.build_engine import ensure_engine
from llmgw_dev.postgres import PostgresServer
from support.failover import FAST_LEADERSHIP, Control, TcpProxy, control_pair
from support.waiting import wait_until

pytestmark = [pytest.mark.slow]
TTL = FAST_LEADERSHIP["ttl"]
_numbers = itertools.count(1)


# pg_server and pg_url (a fresh database) come from tests/conftest.py.


@pytest.fixture(scope="module")
def engine_archive(llama_server_binary: Path) -> Path:
    return ensure_engine()


def chat(control: Control) -> Any:
    client = openai.OpenAI(base_url=control.api_url + "/v1", api_key="none", max_retries=0, timeout=60)
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


async def served_through(controls: list[Control], timeout: float = 60) -> Control:
    """A client that retries across the control addresses it knows until one serves it."""
    turn = itertools.cycle(controls)

    async def one_try() -> Control | None:
        control = next(turn)
        try:
            answer = await trio.to_thread.run_sync(chat, control)
        except (openai.APIStatusError, openai.APIConnectionError):
            return None
        assert answer.usage.completion_tokens == 4
        return control

    served: Control = await wait_until(one_try, timeout=timeout, interval=0.2)
    return served


def tiny_replicas(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    replicas: list[dict[str, Any]] = next(m for m in models if m["model"] == "tiny")["replicas"]
    return replicas


@pytest.mark.engine
async def test_kill_9_the_leader_the_standby_takes_over_and_adopts_the_engines(
    tmp_path: Path, pg_url: str, tiny_model: Path, engine_archive: Path
) -> None:
    async with control_pair(tmp_path, pg_url, tiny_model=tiny_model, engine_archive=engine_archive) as pair:
        c1, c2 = pair.controls
        await pair.add_node("n1", c1)
        await pair.add_node("n2", c1)
        assert await served_through([c1]) is c1  # a cold start on the leader
        _, models = await c1.state()
        (replica,) = tiny_replicas(models)
        engines = pair.engine_pids()
        assert len(engines) == 1
        nodes, _ = await c2.state()
        # The standby holds no connection to nodes (they were sent to the leader): it shows what the
        # store has of the leader's fleet, never a live state of its own.
        assert {n["id"] for n in nodes} <= {"n1", "n2"} and all(n["state"] == "registered" for n in nodes)

        await c1.daemon.stop(signal.SIGKILL)
        killed = time.monotonic()
        took_over = await c2.wait_role("leader", timeout=TTL + 5)
        assert took_over - killed <= TTL + 1, f"takeover took {took_over - killed:.2f} s"

        # The nodes come to the new leader, which adopts the running engine instead of starting one.
        await c2.wait_for(
            lambda nodes, models: (
                sorted(n["id"] for n in nodes if n["state"] == "ready") == ["n1", "n2"]
                and [r["id"] for r in tiny_replicas(models)] == [replica["id"]]
            ),
            timeout=25,
        )
        assert await served_through([c1, c2], timeout=30) is c2
        assert pair.engine_pids() == engines  # the same process: adopted, not restarted
        _, models = await c2.state()
        assert [r["node"] for r in tiny_replicas(models)] == [replica["node"]]


async def test_sigterm_hands_over_in_under_a_second(tmp_path: Path, pg_url: str) -> None:
    async with control_pair(tmp_path, pg_url) as pair:
        c1, c2 = pair.controls
        # A key made on the leader, to be checked by the next one: the digest secret is shared.
        async with httpx2.AsyncClient(base_url=c1.admin_url, timeout=10) as admin:
            group = (await admin.post("/api/v1/groups", json={"name": "team"})).json()["group"]
            made = (await admin.post("/api/v1/keys", json={"name": "app", "group_id": group["id"]})).json()
        c1.daemon.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        took_over = await c2.wait_role("leader", timeout=TTL + 5)
        assert took_over - stopped < 1.0, f"hand-over took {took_over - stopped:.2f} s"
        assert c1.daemon.process is not None
        with trio.fail_after(10):
            assert await c1.daemon.process.wait() == 0
        assert "leader lease given up" in c1.daemon.log()
        async with httpx2.AsyncClient(base_url=c2.api_url, timeout=10) as client:
            accepted = await client.get("/v1/models", headers={"authorization": f"Bearer {made['secret']}"})
            assert accepted.status_code == 200, accepted.text
            wrong = await client.get("/v1/models", headers={"authorization": "Bearer sk-llmgw-wrong"})
            assert wrong.status_code == 401


async def test_a_leader_cut_off_from_its_database_steps_down(
    tmp_path: Path, pg_server: PostgresServer, pg_url: str
) -> None:
    proxy = TcpProxy(pg_server.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        # c1 reaches the database through the proxy, c2 directly: only c1 is cut off.
        c1_url = pg_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
        async with control_pair(tmp_path, pg_url, c1_store=c1_url) as pair:
            c1, c2 = pair.controls
            proxy.cut()
            cut = time.monotonic()
            stepped_down = await c1.wait_role("standby", timeout=TTL + 5)
            # It must stop acting before its lease can lapse and another daemon may lead.
            assert stepped_down - cut < TTL, f"stepping down took {stepped_down - cut:.2f} s"
            took_over = await c2.wait_role("leader", timeout=TTL + 5)
            assert took_over >= stepped_down
            async with httpx2.AsyncClient() as client:
                # A standby serves (leadership.standby_serves): its health says so in a 200 and
                # it places nothing (test_leadership covers the standby 503). Cut off from the
                # database, it cannot know who leads now.
                health = await client.get(c1.api_url + "/healthz")
                assert health.status_code == 200 and health.json()["role"] == "standby"
                assert (await c2.role(client))[0] == "leader"
        nursery.cancel_scope.cancel()


@pytest.mark.engine
async def test_both_daemons_serve_and_the_standby_keeps_serving_when_the_leader_is_killed(
    tmp_path: Path, pg_url: str, tiny_model: Path, engine_archive: Path
) -> None:
    async with control_pair(tmp_path, pg_url, tiny_model=tiny_model, engine_archive=engine_archive) as pair:
        c1, c2 = pair.controls
        await pair.add_node("n1", c1)
        assert await served_through([c1]) is c1  # a cold start: only the leader places
        # The standby learns the replica from the leader's published view and serves it too.
        assert await served_through([c2], timeout=15) is c2
        for control in [c1, c2] * 3:  # a client spreading requests over both: every one answered
            answer = await trio.to_thread.run_sync(chat, control)
            assert answer.usage.completion_tokens == 4

        await c1.daemon.stop(signal.SIGKILL)
        # At once (no retry, well inside the lease TTL): the standby serves the replicas that were ready.
        answer = await trio.to_thread.run_sync(chat, c2)
        assert answer.usage.completion_tokens == 4
        await c2.wait_role("leader", timeout=TTL + 5)
        assert await served_through([c2], timeout=30) is c2  # and placement is handed over as today


@pytest.mark.engine
async def test_kill_9_the_standby_and_the_leader_keeps_serving(
    tmp_path: Path, pg_url: str, tiny_model: Path, engine_archive: Path
) -> None:
    async with control_pair(tmp_path, pg_url, tiny_model=tiny_model, engine_archive=engine_archive) as pair:
        c1, c2 = pair.controls
        await pair.add_node("n1", c1)
        assert await served_through([c1]) is c1
        assert await served_through([c2], timeout=15) is c2
        await c2.daemon.stop(signal.SIGKILL)
        for _ in range(3):  # no retry needed: the leader never depended on the standby
            answer = await trio.to_thread.run_sync(chat, c1)
            assert answer.usage.completion_tokens == 4
        assert await served_through([c1, c2], timeout=10) is c1  # a client that tries both: no error
