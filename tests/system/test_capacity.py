"""A capacity run against the real llama-server, end to end: ``ctl bench`` as an operator types it,
on a fleet of real daemons, the node installing the engine from control and the run starting a
replica on the node it names (none runs before), measuring it, storing what makes it comparable,
and releasing it; the measured slots are then what the profile's next replica there admits."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx2
import pytest
import trio

from llmgw_dev.build_engine import ensure_engine
from support.fleet import BIN, node_ready, running_fleet
from support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow]

LEVELS = "1,2"


@pytest.fixture(scope="session")
def engine_archive(llama_server_binary: Path) -> Path:
    return ensure_engine()


async def test_ctl_bench_measures_a_real_replica_started_for_the_run(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    # An objective any level meets on this machine: the slot count is the highest level measured.
    weights_sha = hashlib.sha256(await trio.Path(tiny_model).read_bytes()).hexdigest()
    profile = {"parallel": 2, "ttft_target": 600.0, "itl_target": 600.0, "idle_timeout": 600.0}
    async with running_fleet(tmp_path, tiny_model, engine_archive, models=[("tiny", profile)]) as fleet:
        await fleet.add_node("n1")
        await fleet.wait_for(node_ready("n1"))
        argv = [
            str(BIN / "llmgw-control"),
            "ctl",
            "--admin",
            fleet.admin_url,
            "bench",
            "tiny",
            "--node",
            "n1",
            "--levels",
            LEVELS,
            "--level-seconds",
            "2",
            "--prompt-tokens",
            "16",
            "--output-tokens",
            "8",
        ]
        with trio.fail_after(240):
            ran = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
        out = ran.stdout.decode()
        assert ran.returncode == 0, (out, ran.stderr.decode(), fleet.control.log()[-3000:])
        levels = [line for line in out.splitlines() if line.startswith("c=")]
        assert [line.split()[0] for line in levels] == ["c=1", "c=2"], out
        assert "on node n1 (started for the run)" in out and out.rstrip().endswith(
            "done: 2 slot(s) meet the profile's objective on this kind of node"
        )

        async with httpx2.AsyncClient(base_url=fleet.admin_url + "/api/v1", timeout=10) as admin:
            (run,) = (await admin.get("/capacity/runs")).json()["runs"]
            assert run["state"] == "done" and run["started_replica"] is True and run["slots"] == 2
            for level in run["results"]:
                assert level["errors"] == 0 and level["requests"] >= level["concurrency"], level
                assert level["generation_tokens_per_s"] > 0 and level["prompt_tokens_per_s"] > 0
                assert 0 < level["ttft_p50_s"] <= level["ttft_p99_s"] and 0 < level["itl_p50_s"] <= level["itl_p99_s"]
            comparable = run["comparable"]
            assert comparable["engine"] == "llama.cpp" and comparable["engine_reported_version"]
            assert comparable["weights_sha256"] == weights_sha
            assert comparable["profile"]["parallel"] == 2 and comparable["node"]["cpu_model"] is not None
            assert comparable["node"]["cores"] > 0 and comparable["hardware"] in comparable["kind"]

            # Released after: the replica the run started is drained (nothing else asked for it).
            async def none_left() -> bool:
                return not (await admin.get("/replicas")).json()["replicas"]

            await wait_until(none_left, timeout=60, interval=0.2)
            assert fleet.engine_pids() == []
            # Used: the next replica of the profile on this kind of node admits what was measured.
            client = httpx2.AsyncClient(base_url=fleet.api_url, timeout=120)
            async with client:
                answer = await client.post(
                    "/v1/chat/completions",
                    json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                )
                assert answer.status_code == 200, answer.text
            (replica,) = (await admin.get("/replicas")).json()["replicas"]
            assert replica["slots"] == 2
