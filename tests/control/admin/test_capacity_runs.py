"""Capacity runs through the admin API, on the daemon in-process with a node whose engines are the
fake engine shaped to saturate at a known concurrency (``saturate_at``): the run measures each
level straight against the replica, finds the highest level meeting the profile's objective, and
that becomes the replica's slot count for admission; a replica started for the run goes after."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from trio_websocket import open_websocket_url

from llmgw_control.fleet.capacity import LevelResult, Measured, profile_fingerprint
from llmgw_control.fleet.replica_records import ReconcilerConfig
from llmgw_dev.engine_proc import free_port
from llmgw_dev.fake_engine import FakeEngine, FakeEngineBehavior, run_fake_engine
from llmgw_shared.facts import unprobed
from llmgw_shared.wire import (
    PROTOCOL_VERSION,
    Ack,
    DrainReplica,
    EngineState,
    Heartbeat,
    Hello,
    ReplicaState,
    ReplicaStateReport,
    StartReplica,
    StopReplica,
    decode,
    encode,
)

from .conftest import JOIN_TOKEN, WEIGHTS_SHA, Daemon, model_doc, running_control, wait_until
from .test_ctl import ok, run

# The fake engine: at most SATURATE_AT responses generate at once, each CHUNKS tokens CHUNK_DELAY
# apart (a second); a request beyond SATURATE_AT waits for a whole response before its first
# token. The objective (TTFT p99 <= 0.5 s) sits in the middle: met at 1 and 2 (TTFT near 0), missed
# at 4 (~1 s), so a loaded machine's stall of up to half a second changes no verdict.
SATURATE_AT = 2
CHUNKS = 10
CHUNK_DELAY = 0.1
TTFT_TARGET = 0.5


@attrs.define
class EngineNode:
    """A scripted node whose starts run the fake engine on the port control chose."""

    node_id: str
    engines: dict[str, FakeEngine] = attrs.Factory(dict)
    commands: list[Any] = attrs.Factory(list)


@asynccontextmanager
async def engine_node(daemon: Daemon, node_id: str = "n1", cpu: str = "Test CPU") -> AsyncIterator[EngineNode]:
    facts = attrs.evolve(
        unprobed(),
        probed=True,
        hostname=node_id,
        ram_total_mib=8192,
        os_name="Debian",
        arch="x86_64",
        cpu_model=cpu,
        cores=4,
        cpu_features=["avx"],
    )
    hello = Hello(PROTOCOL_VERSION, node_id, JOIN_TOKEN, facts, [EngineState("llama.cpp", "b11312", "installed")], [])
    node = EngineNode(node_id)
    async with open_websocket_url(daemon.agent_url) as ws, trio.open_nursery() as nursery:

        async def engine(
            behavior: FakeEngineBehavior,
            replica_id: str,
            port: int,
            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        ) -> None:
            async with run_fake_engine(behavior, port=port) as running:
                node.engines[replica_id] = running
                task_status.started()
                await trio.sleep_forever()  # until the node's nursery is cancelled

        async def beat() -> None:
            seq = 0
            while True:  # until the nursery is cancelled below
                seq += 1
                await ws.send_message(encode(Heartbeat(seq)))
                await trio.sleep(0.2)

        async def serve() -> None:
            while True:
                message = decode(await ws.get_message())
                if not isinstance(message, StartReplica | DrainReplica | StopReplica):
                    continue
                node.commands.append(message)
                await ws.send_message(encode(Ack(message.id, True)))
                if isinstance(message, StartReplica):
                    spec = message.replica
                    behavior = FakeEngineBehavior(
                        models=["tiny"],
                        chunks=CHUNKS,
                        chunk_delay=CHUNK_DELAY,
                        api_key=spec.api_key,
                        saturate_at=SATURATE_AT,
                    )
                    await nursery.start(engine, behavior, spec.replica_id, spec.port)
                    state = ReplicaState(spec.replica_id, "ready", port=spec.port)
                else:
                    state = ReplicaState(message.replica_id, "stopped")
                await ws.send_message(encode(ReplicaStateReport(state)))

        await ws.send_message(encode(hello))
        assert json.loads(await ws.get_message())["type"] == "welcome"
        nursery.start_soon(serve)
        nursery.start_soon(beat)
        yield node
        nursery.cancel_scope.cancel()


def settings() -> dict[str, Any]:
    # One port, free now: the fake engine of the one replica listens there.
    port = free_port()
    return {"reconciler": ReconcilerConfig(interval=0.2, port_min=port, port_max=port)}


async def finished(daemon: Daemon, run_id: str, timeout: float = 90) -> dict[str, Any]:
    answer: dict[str, Any] = {}

    async def done() -> bool:
        answer.update((await daemon.admin.get(f"/capacity/runs/{run_id}")).json()["run"])
        return answer["state"] in ("done", "failed", "cancelled")

    await wait_until(done, timeout)
    return answer


SWEEP = {"model": "tiny", "levels": [4, 1, 2], "level_seconds": 1, "prompt_tokens": 8, "output_tokens": CHUNKS}


@pytest.mark.slow  # left out of the quick tier: a whole capacity sweep
async def test_a_run_on_an_existing_replica_sets_its_slots_to_the_level_meeting_the_objective(tmp_path: Path) -> None:
    model = model_doc(parallel=1, min_replicas=1, ttft_target=TTFT_TARGET)
    async with (
        running_control(tmp_path, models=[model], control_settings=settings()) as daemon,
        engine_node(daemon) as node,
    ):
        reconciler = daemon.fleet.reconciler
        await wait_until(lambda: _async(bool(reconciler.replicas.for_model("tiny:cpu"))))
        replica = reconciler.replicas.for_model("tiny:cpu")[0]
        assert replica.slots == 1  # parallel: nothing measured yet

        answer = await daemon.admin.post("/capacity/runs", json=SWEEP)
        assert answer.status_code == 202, answer.text
        queued = answer.json()["run"]
        assert queued["state"] in ("queued", "running") and queued["levels"] == [1, 2, 4]
        run = await finished(daemon, queued["id"])

        assert run["state"] == "done", run
        assert [lv["concurrency"] for lv in run["results"]] == [1, 2, 4] and run["levels_done"] == 3
        assert [lv["meets_objective"] for lv in run["results"]] == [True, True, False], run["results"]
        assert run["slots"] == SATURATE_AT
        assert all(lv["errors"] == 0 and lv["requests"] >= lv["concurrency"] for lv in run["results"])
        assert all(lv["generation_tokens_per_s"] > 0 and lv["prompt_tokens_per_s"] > 0 for lv in run["results"])
        assert run["node_id"] == "n1" and run["replica_id"] == replica.id and run["started_replica"] is False
        comparable = run["comparable"]
        assert (comparable["engine"], comparable["engine_version"]) == ("llama.cpp", "b11312")
        assert comparable["weights_sha256"] == WEIGHTS_SHA
        assert comparable["profile"]["parallel"] == 1 and comparable["node"]["cpu_model"] == "Test CPU"
        # Straight to the replica, with the replica's key as the router sends it.
        engine = node.engines[replica.id]
        assert engine.observed.requests and all(
            r.path == "/v1/completions" and r.headers["authorization"] == f"Bearer {replica.api_key}"
            for r in engine.observed.requests
        )
        assert engine.observed.max_in_flight == 4

        # Used: the replica (the same one, its counters kept) admits the measured concurrency.
        await wait_until(lambda: _async(replica.slots == SATURATE_AT))
        assert reconciler.replicas.for_model("tiny:cpu") == [replica]
        listed = (await daemon.admin.get("/capacity/runs", params={"model": "tiny"})).json()["runs"]
        assert [r["id"] for r in listed] == [run["id"]]

    # A restart learns the stored run again: the new replica gets the measured slots at once.
    async with running_control(tmp_path, models=[model], control_settings=settings()) as daemon, engine_node(daemon):
        reconciler = daemon.fleet.reconciler
        await wait_until(lambda: _async(bool(reconciler.replicas.for_model("tiny:cpu"))))
        assert reconciler.replicas.for_model("tiny:cpu")[0].slots == SATURATE_AT
        stored = (await daemon.admin.get(f"/capacity/runs/{run['id']}")).json()["run"]
        assert stored["state"] == "done" and stored["results"] == run["results"]


@pytest.mark.slow  # left out of the quick tier: a whole capacity run
async def test_another_kind_of_node_keeps_parallel(tmp_path: Path) -> None:
    """A run's numbers hold for its capacity kind only: a node with another CPU keeps parallel."""
    model = model_doc(parallel=1, min_replicas=1, ttft_target=TTFT_TARGET)
    async with (
        running_control(tmp_path, models=[model], control_settings=settings()) as daemon,
        engine_node(daemon, cpu="Other CPU"),
    ):
        reconciler = daemon.fleet.reconciler
        await wait_until(lambda: _async(bool(reconciler.replicas.for_model("tiny:cpu"))))
        replica = reconciler.replicas.for_model("tiny:cpu")[0]
        # A run measured on a "Test CPU" node, as stored by another daemon.
        level = LevelResult(4, 10, 0, 1.0, 10.0, 10.0, 0.01, 0.01, 0.01, 0.01)
        resolved = daemon.fleet.catalog.resolve("tiny:cpu")
        assert resolved is not None
        reconciler.capacity.learn(
            Measured(
                "tiny:cpu", "x86_64 (Test CPU)", "llama.cpp", "b11312", (level,), profile_fingerprint(resolved.profile)
            )
        )
        assert reconciler.replica_slots_on("tiny:cpu", resolved.profile, reconciler.inventory.get("n1")) == 1
        reconciler.wake()
        with trio.move_on_after(1.0):  # a few passes: the slots must not move
            await wait_until(lambda: _async(replica.slots != 1), timeout=1.0)
        assert replica.slots == 1
        # The same numbers measured on this node's kind do apply (so the above was the kind's doing).
        reconciler.capacity.learn(
            Measured(
                "tiny:cpu", "x86_64 (Other CPU)", "llama.cpp", "b11312", (level,), profile_fingerprint(resolved.profile)
            )
        )
        reconciler.wake()
        await wait_until(lambda: _async(replica.slots == 4))


@pytest.mark.slow  # left out of the quick tier: a whole capacity run
@pytest.mark.parametrize("where", [{"node": "n1"}, {}], ids=["on-the-node-named", "through-the-activator"])
async def test_a_replica_started_for_a_run_is_released_after(tmp_path: Path, where: dict[str, str]) -> None:
    model = model_doc(parallel=1, ttft_target=TTFT_TARGET)
    async with (
        running_control(tmp_path, models=[model], control_settings=settings()) as daemon,
        engine_node(daemon) as node,
    ):
        assert daemon.fleet.reconciler.replicas.for_model("tiny:cpu") == []
        answer = await daemon.admin.post("/capacity/runs", json={**SWEEP, "levels": [1], **where})
        assert answer.status_code == 202, answer.text
        run = await finished(daemon, answer.json()["run"]["id"])
        assert run["state"] == "done" and run["started_replica"] is True, run
        await wait_until(
            lambda: _async(
                any(isinstance(c, DrainReplica) and c.replica_id == run["replica_id"] for c in node.commands)
            )
        )


async def test_a_run_is_cancelled_by_delete_and_then_is_finished(tmp_path: Path) -> None:
    model = model_doc(parallel=1, min_replicas=1)
    async with running_control(tmp_path, models=[model], control_settings=settings()) as daemon, engine_node(daemon):
        body = {**SWEEP, "levels": [1], "level_seconds": 600}
        run = (await daemon.admin.post("/capacity/runs", json=body)).json()["run"]
        second = (await daemon.admin.post("/capacity/runs", json=body)).json()["run"]
        await wait_until(lambda: _state_is(daemon, run["id"], "running"))
        # The second waits its turn: one run measures at a time.
        assert (await daemon.admin.get(f"/capacity/runs/{second['id']}")).json()["run"]["state"] == "queued"
        for path, method in (
            (f"/capacity/runs/{second['id']}/cancel", "POST"),
            (f"/capacity/runs/{run['id']}", "DELETE"),
        ):
            answer = await daemon.admin.request(method, path)
            assert answer.status_code == 200 and answer.json()["run"]["state"] == "cancelled", answer.text
        assert (await finished(daemon, run["id"]))["state"] == "cancelled"
        again = await daemon.admin.delete(f"/capacity/runs/{run['id']}")
        assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
        # Nothing left measuring: the replica is no longer held busy.
        await wait_until(lambda: _async(not daemon.fleet.reconciler.benchmarking))


@pytest.mark.slow  # left out of the quick tier: a whole capacity run
async def test_a_replica_that_answers_errors_fails_the_run_with_the_engines_words(tmp_path: Path) -> None:
    model = model_doc(parallel=1, min_replicas=1)
    async with (
        running_control(tmp_path, models=[model], control_settings=settings()) as daemon,
        engine_node(daemon) as node,
    ):
        reconciler = daemon.fleet.reconciler
        await wait_until(lambda: _async(bool(reconciler.replicas.for_model("tiny:cpu"))))
        (engine,) = node.engines.values()
        engine.behavior.status_before_body = 500
        answer = await daemon.admin.post("/capacity/runs", json={**SWEEP, "levels": [1, 2]})
        run = await finished(daemon, answer.json()["run"]["id"])
        assert run["state"] == "failed" and run["levels_done"] == 1, run
        assert (
            run["error"].startswith("no request at concurrency 1 succeeded: HTTP 500")
            and "fake engine failure" in run["error"]
        )
        assert run["results"][0]["errors"] > 0 and run["slots"] is None
        # Nothing learnt: the replica keeps parallel.
        assert reconciler.replicas.for_model("tiny:cpu")[0].slots == 1 and not reconciler.benchmarking


@pytest.mark.slow  # left out of the quick tier: ctl as a process, a whole sweep
async def test_ctl_bench_prints_a_line_per_level_and_exits_0_when_done(tmp_path: Path) -> None:
    model = model_doc(parallel=1, min_replicas=1, ttft_target=TTFT_TARGET)
    async with running_control(tmp_path, models=[model], control_settings=settings()) as daemon, engine_node(daemon):
        await wait_until(lambda: _async(bool(daemon.fleet.reconciler.replicas.for_model("tiny:cpu"))))
        ran = await ok(
            daemon,
            "bench",
            "tiny:cpu",
            "--node",
            "n1",
            "--levels",
            "1,2,4",
            "--level-seconds",
            "1",
            "--prompt-tokens",
            "8",
            "--output-tokens",
            str(CHUNKS),
        )
        lines = ran.out.splitlines()
        assert lines[0].startswith("capacity run ") and "tiny:cpu, levels 1,2,4, 1 s each" in lines[0], ran.out
        assert lines[1].startswith("replica ") and "on node n1 (already running)" in lines[1]
        levels = [line for line in lines if line.startswith("c=")]
        assert [line.split()[0] for line in levels] == ["c=1", "c=2", "c=4"], ran.out
        assert "meets the objective" in levels[0] and "misses the objective" in levels[2]
        assert "tok/s" in levels[0] and "TTFT p50" in levels[0] and "ITL p50" in levels[0]
        assert lines[-1] == f"done: {SATURATE_AT} slot(s) meet the profile's objective on this kind of node"
        table = (await ok(daemon, "capacity", "runs")).out.splitlines()
        assert table[0].split()[:3] == ["ID", "MODEL", "STATE"] and table[1].split()[1:3] == ["tiny:cpu", "done"]
        # Refusals come back as the API said them, with a non-zero exit.
        for argv, words in (
            (("bench", "nope"), "model 'nope' not found"),
            (("bench", "tiny", "--levels", "1,x"), "--levels"),
            (("bench", "tiny", "--levels", "0"), "levels[0]"),
        ):
            failed = await run(daemon, *argv)
            assert failed.code == 1 and words in failed.err, failed


async def test_a_run_cut_short_by_a_restart_is_failed_after_it(tmp_path: Path) -> None:
    model = model_doc(parallel=1, min_replicas=1)
    async with running_control(tmp_path, models=[model], control_settings=settings()) as daemon, engine_node(daemon):
        run = (await daemon.admin.post("/capacity/runs", json={**SWEEP, "levels": [1], "level_seconds": 600})).json()[
            "run"
        ]
        # Measuring (its replica taken), not still waiting for one when the daemon stops.
        await wait_until(lambda: _has_replica(daemon, run["id"]))
    async with running_control(tmp_path, models=[model], control_settings=settings()) as daemon:
        stored = (await daemon.admin.get(f"/capacity/runs/{run['id']}")).json()["run"]
        assert stored["state"] == "failed" and stored["error"] == "control stopped during the run", stored


BAD_BODIES = [
    ({"model": "tiny", "levels": [0]}, "levels[0]"),
    ({"model": "tiny", "levels": [513]}, "levels[0]"),
    ({"model": "tiny", "levels": list(range(1, 66))}, "levels"),
    ({"model": "tiny", "levels": []}, "levels"),
    ({"model": "tiny", "levels": ["1"]}, "levels[0]"),
    ({"model": "tiny", "level_seconds": 0.5}, "level_seconds"),
    ({"model": "tiny", "level_seconds": 601}, "level_seconds"),
    ({"model": "tiny", "levels": list(range(1, 11)), "level_seconds": 600}, "level_seconds"),
    ({"model": "tiny", "prompt_tokens": 0}, "prompt_tokens"),
    ({"model": "tiny", "prompt_tokens": 250, "output_tokens": 10}, "prompt_tokens"),
    ({"model": "tiny", "output_tokens": 5000}, "output_tokens"),
    ({"model": "tiny:cpu", "profile": "gpu"}, "profile"),
    ({"model": "tiny", "bogus": 1}, "bogus"),
    ({"levels": [1]}, "model"),
    ({"model": "x" * 300}, "model"),
]


@pytest.fixture
async def tiny_daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    async with running_control(tmp_path, models=[model_doc()]) as daemon:
        yield daemon


@pytest.mark.parametrize(("body", "field"), BAD_BODIES)
async def test_bad_bodies_are_refused_naming_the_field(tiny_daemon: Daemon, body: dict[str, Any], field: str) -> None:
    daemon = tiny_daemon
    answer = await daemon.admin.post("/capacity/runs", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field, answer.text
    assert (await daemon.admin.get("/capacity/runs")).json()["runs"] == []


async def test_unknown_model_node_and_run_are_404(tiny_daemon: Daemon) -> None:
    daemon = tiny_daemon
    for body, field in (
        ({"model": "nope"}, "model"),
        ({"model": "tiny:gpu"}, "model"),
        ({"model": "tiny", "node": "nowhere"}, "node"),
    ):
        answer = await daemon.admin.post("/capacity/runs", json=body)
        assert answer.status_code == 404 and answer.json()["error"]["field"] == field, answer.text
    for method, path in (
        ("GET", "/capacity/runs/nope"),
        ("DELETE", "/capacity/runs/nope"),
        ("POST", "/capacity/runs/nope/cancel"),
    ):
        assert (await daemon.admin.request(method, path)).status_code == 404
    assert (await daemon.admin.get("/capacity/runs", params={"bogus": "1"})).status_code == 400


async def _async(value: bool) -> bool:
    return value


async def _has_replica(daemon: Daemon, run_id: str) -> bool:
    return bool((await daemon.admin.get(f"/capacity/runs/{run_id}")).json()["run"]["replica_id"])


async def _state_is(daemon: Daemon, run_id: str, state: str) -> bool:
    return bool((await daemon.admin.get(f"/capacity/runs/{run_id}")).json()["run"]["state"] == state)
