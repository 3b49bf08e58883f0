"""The fleet under churn, as processes with the real engine: one control, three node daemons.

Each test breaks the fleet the way issue 15 found it breaking, and checks what clients and the
admin API see afterwards: a node restarted without its engines must not leave a dead replica
published, and losing two of three nodes must move replicas within the reschedule limit.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from llmgw_dev.build_engine import ensure_engine
from support.fleet import Fleet, model_entry, running_fleet

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="session")
def engine_archive(llama_server_binary: Path) -> Path:
    return ensure_engine()


def replicas_of(models: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    return next(m for m in models if m["model"] == model)["replicas"]


def ready(models: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    return [r for r in replicas_of(models, model) if r["state"] == "ready"]


async def published(fleet: Fleet) -> dict[str, dict[str, Any]]:
    import httpx2

    async with httpx2.AsyncClient(base_url=fleet.admin_url, timeout=10) as client:
        replicas = (await client.get("/api/v1/replicas")).json()["replicas"]
    return {r["id"]: r for r in replicas}


async def add_models(fleet: Fleet, tiny_model: Path, *names: str, **profile: Any) -> None:
    """Add models through the admin API once every node has joined, so their replicas spread over
    the nodes (placed from the config, they would all land on the first node to join)."""
    import httpx2

    async with httpx2.AsyncClient(base_url=fleet.admin_url, timeout=10) as client:
        for name in names:
            response = await client.post(
                "/api/v1/models", json=model_entry(name, tiny_model, fleet.agent_url, **profile)
            )
            assert response.status_code == 201, response.text


async def chat_ok(fleet: Fleet, model: str = "tiny") -> None:
    import httpx2

    async with httpx2.AsyncClient(base_url=fleet.api_url, timeout=60) as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
    assert response.status_code == 200, response.text


async def settled(fleet: Fleet, predicate: Any, timeout: float) -> tuple[list[Any], list[Any]]:
    """``fleet.wait_for``, failing with what the admin API said last rather than a bare timeout."""
    try:
        return await fleet.wait_for(predicate, timeout=timeout)
    except trio.TooSlowError:
        nodes, models = await fleet.state()
        raise AssertionError(f"not reached in {timeout:g} s; nodes: {nodes}; models: {models}") from None


async def test_a_node_restarted_without_its_engines_has_its_replica_replaced(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    """Kill a node daemon and its engines, restart it before ``lost_after``: its hello reports no
    replicas, so the old replica is forgotten (never published again at its dead port) and the
    model is back at min_replicas. (Before the fix the record stayed ``ready`` forever.)"""
    async with running_fleet(tmp_path, tiny_model, engine_archive, agents={"lost_after": 120.0}) as fleet:
        for node_id in ("n1", "n2", "n3"):
            await fleet.add_node(node_id)
        await add_models(fleet, tiny_model, "two", min_replicas=2, max_replicas=2)
        _, models = await fleet.wait_for(lambda nodes, models: len(ready(models, "two")) == 2, timeout=90)
        assert len({r["node"] for r in ready(models, "two")}) == 2  # spread over two nodes
        victim = ready(models, "two")[0]
        await fleet.nodes[victim["node"]].stop(signal.SIGKILL)
        fleet.kill_engines(victim["node"])
        await fleet.nodes[victim["node"]].start()

        def replaced(nodes: list[Any], models: list[Any]) -> bool:
            ids = {r["id"] for r in replicas_of(models, "two")}
            node_back = any(n["id"] == victim["node"] and n["state"] == "ready" for n in nodes)
            return node_back and victim["id"] not in ids and len(ready(models, "two")) == 2

        # Well inside lost_after (120 s): what removes the replica is the node's own report.
        await settled(fleet, replaced, timeout=60)
        assert victim["id"] not in await published(fleet)
        for _ in range(4):
            await chat_ok(fleet, "two")


async def test_losing_two_of_three_nodes_moves_replicas_within_the_reschedule_limit(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    """1 move at once, then 1 per 20 s: losing 2 of 3 nodes (4 of 6 replicas) moves one replica,
    then no other for a while, then the next. (Before the fix all 4 moved in one pass.)"""
    async with running_fleet(
        tmp_path, tiny_model, engine_archive, reconciler={"reschedule_burst": 1, "reschedules_per_minute": 3.0}
    ) as fleet:
        for node_id in ("n1", "n2", "n3"):
            await fleet.add_node(node_id)
        await add_models(fleet, tiny_model, "a", "b", min_replicas=3, max_replicas=3)
        await fleet.wait_for(
            lambda nodes, models: len(ready(models, "a")) == 3 and len(ready(models, "b")) == 3, timeout=120
        )
        _, models = await fleet.state()
        before = {r["id"] for m in ("a", "b") for r in replicas_of(models, m)}
        assert len(before) == 6
        assert {r["node"] for r in replicas_of(models, "a")} == {"n1", "n2", "n3"}
        for node_id in ("n2", "n3"):
            await fleet.nodes[node_id].stop(signal.SIGKILL)
            fleet.kill_engines(node_id)

        def moved(models: list[Any]) -> list[dict[str, Any]]:
            return [r for m in ("a", "b") for r in replicas_of(models, m) if r["id"] not in before]

        _, models = await settled(fleet, lambda nodes, models: bool(moved(models)), timeout=30)
        first = moved(models)
        assert len(first) == 1 and first[0]["node"] == "n1", first
        # The bucket is empty now and refills one token in 20 s: nothing else moves for a while.
        with trio.move_on_after(10):
            while True:
                _, models = await fleet.state()
                assert len(moved(models)) == 1, moved(models)
                await trio.sleep(0.2)
        # ... and then the next one does: the limit delays moves, it does not stop them.
        await settled(fleet, lambda nodes, models: len(moved(models)) == 2, timeout=30)


async def test_after_a_restart_control_places_once_its_nodes_are_back_not_after_the_settle_time(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    """The demo's restart: both daemons stopped (the engine with the node), both started again.
    The node that held the replica is back at once, so the first request's cold start must not
    wait out the settle hold (30 s here); before the fix it always did (15 s in the demo)."""
    import httpx2

    async with running_fleet(tmp_path, tiny_model, engine_archive, leadership={"settle": 30.0}) as fleet:
        await fleet.add_node("n1")
        await chat_ok(fleet)
        await trio.sleep(2)  # the leader writes down which nodes hold replicas (within a second)
        assert await fleet.control.stop(signal.SIGTERM) == 0
        await fleet.nodes["n1"].stop(signal.SIGTERM)
        fleet.kill_engines()
        await fleet.start_control()
        await fleet.nodes["n1"].start()
        async with httpx2.AsyncClient(base_url=fleet.api_url, timeout=60) as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
        assert response.status_code == 200, response.text
        # Held while the node came back and the engine started: seconds, not the 30 s hold.
        assert float(response.headers["x-llmgw-queued-ms"]) < 15_000, response.headers["x-llmgw-queued-ms"]
