"""The two daemons as processes with the real engine: placement, failover, adoption, unload."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import openai
import pytest
import trio

from llmgw_dev.build_engine import ensure_engine
from support.fleet import Fleet, running_fleet
from support.waiting import wait_until

T = TypeVar("T")
pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="session")
def engine_archive(llama_server_binary: Path) -> Path:
    return ensure_engine()


def chat(fleet: Fleet, model: str = "tiny", **extra: Any) -> Any:
    client = openai.OpenAI(base_url=fleet.api_url + "/v1", api_key="none", max_retries=0, timeout=120)
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, **extra
    )


def replicas_of(models: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    return next(m for m in models if m["model"] == model)["replicas"]


async def test_cold_start_then_a_second_model_on_the_other_node(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    async with running_fleet(tmp_path, tiny_model, engine_archive, models=[("tiny", {}), ("tiny2", {})]) as fleet:
        await fleet.add_node("n1")
        await fleet.add_node("n2")
        raw = await trio.to_thread.run_sync(chat, fleet)
        assert raw.parse().usage.completion_tokens == 4
        assert float(raw.headers["x-llmgw-queued-ms"]) > 0  # it waited for the cold start
        raw = await trio.to_thread.run_sync(chat, fleet, "tiny2")
        assert raw.parse().model == "tiny2"
        _, models = await fleet.state()
        (first,) = replicas_of(models, "tiny")
        (second,) = replicas_of(models, "tiny2")
        assert {first["node"], second["node"]} == {"n1", "n2"}
        # Warm: served at once.
        raw = await trio.to_thread.run_sync(chat, fleet)
        assert "x-llmgw-queued-ms" not in raw.headers
        # The real llama-server's own lines, asked of its node through the admin API (issue 19).
        async with httpx2.AsyncClient(base_url=fleet.admin_url + "/api/v1", timeout=30) as admin:
            logs = (await admin.get(f"/replicas/{first['id']}/logs", params={"lines": "400"})).json()
        assert logs["source"] == "node" and any("listening" in line for line in logs["lines"]), logs


async def test_a_killed_node_and_its_engine_come_back_on_the_other_node(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    async with running_fleet(tmp_path, tiny_model, engine_archive) as fleet:
        await fleet.add_node("n1")
        await fleet.add_node("n2")
        await trio.to_thread.run_sync(chat, fleet)
        _, models = await fleet.state()
        (replica,) = replicas_of(models, "tiny")
        victim = replica["node"]
        survivor = "n2" if victim == "n1" else "n1"
        await fleet.nodes[victim].stop(signal.SIGKILL)
        fleet.kill_engines(victim)

        # A client that retries until served, as clients of a fleet do.
        async def served() -> bool:
            try:
                await trio.to_thread.run_sync(chat, fleet)
            except openai.APIError:
                return False
            return True

        await wait_until(served, timeout=60, interval=0.5)
        _, models = await fleet.state()
        (replica,) = replicas_of(models, "tiny")
        assert replica["node"] == survivor


async def test_a_restarted_control_adopts_running_engines(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    async with running_fleet(tmp_path, tiny_model, engine_archive) as fleet:
        await fleet.add_node("n1")
        await trio.to_thread.run_sync(chat, fleet)
        pids = fleet.engine_pids()
        assert len(pids) == 1
        assert await fleet.control.stop(signal.SIGTERM) == 0
        await fleet.start_control()
        await fleet.wait_for(
            lambda nodes, models: replicas_of(models, "tiny") and replicas_of(models, "tiny")[0]["state"] == "ready"
        )
        for _ in range(5):
            raw = await trio.to_thread.run_sync(chat, fleet)
            assert raw.http_response.status_code == 200
            assert "x-llmgw-queued-ms" not in raw.headers  # nothing had to start
        assert fleet.engine_pids() == pids  # the same engine process, adopted


async def test_a_model_no_node_can_fit_gets_503_with_the_reason(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    huge = {"ram_mib": 50_000_000}
    async with running_fleet(
        tmp_path, tiny_model, engine_archive, models=[("huge", huge)], activator={"max_wait": 2.0}
    ) as fleet:
        await fleet.add_node("n1")
        async with httpx2.AsyncClient(base_url=fleet.api_url, timeout=30) as client:
            response = await client.post(
                "/v1/chat/completions", json={"model": "huge", "messages": [{"role": "user", "content": "x"}]}
            )
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "model_not_ready"
        assert "no node fits" in error["message"] and "needs 50000000 MiB RAM" in error["message"]
        assert response.headers["retry-after"]


async def test_an_idle_replica_is_unloaded(tmp_path: Path, tiny_model: Path, engine_archive: Path) -> None:
    async with running_fleet(tmp_path, tiny_model, engine_archive, models=[("tiny", {"idle_timeout": 2.0})]) as fleet:
        await fleet.add_node("n1")
        await trio.to_thread.run_sync(chat, fleet)
        assert len(fleet.engine_pids()) == 1
        await fleet.wait_for(lambda nodes, models: not replicas_of(models, "tiny"), timeout=30)
        await wait_until(lambda: not fleet.engine_pids(), timeout=15, interval=0.2)
        # And it comes back on demand.
        raw = await trio.to_thread.run_sync(chat, fleet)
        assert raw.http_response.status_code == 200
