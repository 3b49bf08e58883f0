"""Demand drives replicas, end to end: control, two node daemons, the real llama-server.

Issue 15 item 2: a model with min 1 / max 3 replicas, 16 concurrent streams against a replica
with ``parallel = 2``, had 16 requests in flight on that one replica and never a second: the
gateway sent every request to the engine, where the queue formed out of sight. Now the replica
gets two at a time, the other fourteen wait in the gateway's queue, and that queue is demand.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import openai
import pytest
import trio

from llmgw_dev.build_engine import ensure_engine
from support.fleet import Fleet, running_fleet
from support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow]

STREAMS = 16


@pytest.fixture(scope="session")
def engine_archive(llama_server_binary: Path) -> Path:
    return ensure_engine()


def _client(fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.api_url + "/v1", api_key="none", max_retries=0, timeout=120)


def _stream_once(client: openai.OpenAI) -> str:
    """One streamed chat through the official client, read to its end; the replica that served it."""
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=24, stream=True
    )
    replica: str = raw.headers["x-llmgw-replica"]
    chunks = sum(1 for _ in raw.parse())
    assert chunks > 0
    return replica


def _ready(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tiny = next(m for m in models if m["model"] == "tiny")
    return [r for r in tiny["replicas"] if r["state"] == "ready"]


async def test_a_burst_that_saturates_one_replica_starts_a_second_and_spreads_over_both(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    profile = {"min_replicas": 1, "max_replicas": 3, "parallel": 2}
    async with running_fleet(tmp_path, tiny_model, engine_archive, models=[("tiny", profile)]) as fleet:
        await fleet.add_node("n1")
        await fleet.add_node("n2")
        _, models = await fleet.wait_for(lambda nodes, models: len(_ready(models)) == 1)
        (first,) = _ready(models)
        served: collections.Counter[str] = collections.Counter()
        errors: list[BaseException] = []

        async def worker() -> None:
            client = _client(fleet)
            try:
                while True:
                    served[await trio.to_thread.run_sync(_stream_once, client)] += 1
            except openai.APIError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(STREAMS):
                nursery.start_soon(worker)
            # Bounded: on the old code no second replica ever starts, and this times out.
            await wait_until(
                lambda: (len(served) >= 2 and all(n >= 3 for n in served.values())) or errors, timeout=120, interval=0.2
            )
            nursery.cancel_scope.cancel()
        assert errors == []
        _, models = await fleet.state()
        ready = _ready(models)
        assert 2 <= len(ready) <= 3 and first["id"] in {r["id"] for r in ready}
        # Requests spread over the replicas, the first one included.
        assert first["id"] in served and len(served) >= 2
