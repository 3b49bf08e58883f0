"""Two models too big to run together on one node take turns, end to end, on the real llama-server.

Control, one node daemon, the real engine. The node's usable RAM is set (through
``reconciler.reserved_ram_mib``) to 1000 MiB and each model reserves 600 (``ram_mib``, a floor the
measurement cannot lower): one fits, two do not. A request for the model that is not loaded
evicts the idle one; requests for both at once are all answered, the models taking turns (a busy
model yields after ``yield_after``), and never are two engines running at once.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import openai
import pytest
import trio

from llmgw_dev.build_engine import ensure_engine
from support.fleet import Fleet, node_ready, running_fleet
from support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow]

USABLE_MIB = 1000
CLAIM_MIB = 600
ROUNDS = 3


@pytest.fixture(scope="session")
def engine_archive(llama_server_binary: Path) -> Path:
    return ensure_engine()


def _total_ram_mib() -> int:
    # What the node daemon on this host reports as ram_total_mib (llmgw_node.probe.parse_meminfo).
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def _ask(fleet: Fleet, model: str) -> str:
    client = openai.OpenAI(base_url=fleet.api_url + "/v1", api_key="none", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert reply.choices[0].message.content is not None
    return model


async def test_two_models_too_big_together_take_turns_on_one_node(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    profile = {"ram_mib": CLAIM_MIB, "max_replicas": 1, "idle_timeout": 600.0}
    reconciler = {"reserved_ram_mib": _total_ram_mib() - USABLE_MIB, "evict_min_age": 1.0, "yield_after": 4.0}
    async with running_fleet(
        tmp_path, tiny_model, engine_archive, models=[("left", profile), ("right", profile)], reconciler=reconciler
    ) as fleet:
        await fleet.add_node("n1")
        await fleet.wait_for(node_ready("n1"))
        most_engines = [0]

        async def count_engines() -> None:
            while True:  # sampled until cancelled below
                most_engines[0] = max(most_engines[0], len(fleet.engine_pids()))
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(count_engines)
            # One after the other: each request evicts the other model (idle by then).
            with trio.fail_after(180):
                for model in ["left", "right", "left"]:
                    assert await trio.to_thread.run_sync(_ask, fleet, model) == model
            # The node measures an engine as it becomes ready; placement accounts that (floored by the
            # configured claim, a reservation).
            _, models = await fleet.wait_for(
                lambda nodes, models: any(
                    m["model"] == "left" and m["replicas"] and m["replicas"][0]["used"] for m in models
                ),
                timeout=20,
            )
            left = next(m for m in models if m["model"] == "left")
            assert [r["state"] for r in left["replicas"]] == ["ready"]
            assert left["replicas"][0]["used"]["ram_mib"] >= CLAIM_MIB
            # Both at once, several rounds each: every request answered, the models taking turns.
            answered: list[str] = []

            async def client(model: str) -> None:
                for _ in range(ROUNDS):
                    answered.append(await trio.to_thread.run_sync(_ask, fleet, model))

            with trio.fail_after(240):
                async with trio.open_nursery() as clients:
                    clients.start_soon(client, "left")
                    clients.start_soon(client, "right")
            nursery.cancel_scope.cancel()
        assert sorted(answered) == ["left"] * ROUNDS + ["right"] * ROUNDS
        # The node reports its weights cache: the one file both models use, in use by the resident.
        async with httpx2.AsyncClient(base_url=fleet.admin_url, timeout=10) as admin:

            async def in_use() -> dict[str, object] | None:
                (node,) = (await admin.get("/api/v1/weights")).json()["nodes"]
                return node if node["reported"] and node["weights"] and node["weights"][0]["in_use"] else None

            node = await wait_until(in_use, timeout=30, interval=0.2)
        (held,) = node["weights"]
        assert held["size"] == (await trio.Path(tiny_model).stat()).st_size and len(held["models"]) == 1
        assert most_engines[0] == 1
        log = fleet.control.log()
        assert "evicting replica" in log and "to make room for right:cpu" in log and "to make room for left:cpu" in log
