"""Replicas on the real llama-server: install, start, chat, crash-restart, drain, stop, adoption."""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import openai
import pytest
import trio
from node.conftest import TAG
from node.helpers import next_engine_state, next_replica_state, replica_spec
from node.release_server import FileServer

from llmgw_dev.engine_proc import free_port
from llmgw_node.config import NodeConfig
from llmgw_node.procs import start_ticks
from llmgw_node.service import NodeService, open_node_service
from llmgw_node.supervisor import Timing
from llmgw_shared.wire import (
    DrainReplica,
    EngineSpec,
    GetReplicaLogs,
    ReplicaLogsReply,
    ReplicaState,
    SetEngines,
    StartReplica,
    StopReplica,
    WeightsSpec,
)
from support.waiting import wait_until

pytestmark = pytest.mark.engine


@asynccontextmanager
async def installed_node(
    config: NodeConfig, files: FileServer, archive: tuple[str, bytes], timing: Timing, *, adopt: bool = True
) -> AsyncIterator[NodeService]:
    name, data = archive
    if files.release_api().replace("{version}", TAG).removeprefix(files.base) not in files.releases:
        files.publish(TAG, {name: data})
    async with open_node_service(config, timing=timing, adopt=adopt) as svc:
        if svc.engines.binary("llama.cpp", TAG) is None:
            ack = await svc.handle(
                SetEngines(id="e1", fencing_token=1, engines=[EngineSpec("llama.cpp", TAG, files.release_api())])
            )
            assert ack.ok, ack.error
            state = await next_engine_state(svc, lambda s: s.status in ("installed", "failed"))
            assert state.status == "installed", state.describe()
        yield svc


def served_weights(files: FileServer, model: Path) -> WeightsSpec:
    data = model.read_bytes()
    return WeightsSpec(url=files.add_file("tiny.gguf", data), sha256=hashlib.sha256(data).hexdigest(), size=len(data))


async def test_start_chat_and_stop(
    node_config: NodeConfig,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    tiny_model: Path,
    fast_timing: Timing,
) -> None:
    async with installed_node(node_config, files, engine_archive, fast_timing) as svc:
        port = free_port()
        spec = replica_spec("tiny-0", served_weights(files, tiny_model), port)
        ack = await svc.handle(StartReplica(id="c1", fencing_token=1, replica=spec))
        assert ack.ok, ack.error
        seen: list[ReplicaState] = []
        ready = await next_replica_state(svc, "tiny-0", lambda s: s.status in ("ready", "failed"), seen=seen)
        assert ready.status == "ready", (ready.describe(), ready.last_lines)
        statuses = [s.status for s in seen]
        assert statuses[0] == "downloading" and "starting" in statuses
        assert any(s.detail.startswith("downloading tiny.gguf") for s in seen)
        # Measured as it became ready: the engine's resident memory (no GPU here).
        measured = await next_replica_state(svc, "tiny-0", lambda s: s.rss_mib > 0, limit_s=20)
        assert measured.status == "ready" and 1 <= measured.rss_mib < 4096 and measured.vram_mib == 0

        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=spec.api_key, max_retries=0)
        reply = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content
        # The engine requires the replica's key.
        wrong = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await wrong.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        # Its output, as control asks for it (issue 19): llama-server's own lines, then, after the
        # cursor, only what the next request made it write.
        logs = await svc.replica_logs(GetReplicaLogs(id="l1", replica_id="tiny-0", lines=500))
        assert logs.found and any("listening" in line for line in logs.lines), logs.lines
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "again"}], max_tokens=2
        )

        async def new_lines() -> ReplicaLogsReply | None:
            after = await svc.replica_logs(GetReplicaLogs(id="l2", replica_id="tiny-0", lines=500, cursor=logs.cursor))
            return after if after.lines else None

        after = await wait_until(new_lines, timeout=10)
        assert not any("listening" in line for line in after.lines), after.lines
        assert not (await svc.replica_logs(GetReplicaLogs(id="l3", replica_id="nope", lines=5))).found
        # The key is not on the command line, where any local user could read it.
        cmdline = await trio.Path(f"/proc/{ready.pid}/cmdline").read_bytes()
        assert spec.api_key.encode() not in cmdline
        assert os.getpgid(ready.pid) == ready.pid  # its own process group

        ack = await svc.handle(StopReplica(id="c2", fencing_token=1, replica_id="tiny-0"))
        assert ack.ok
        stopped = await next_replica_state(svc, "tiny-0", lambda s: s.status == "stopped")
        assert stopped.status == "stopped"
        assert start_ticks(ready.pid) is None


async def test_crashing_engine_is_restarted_with_backoff_then_left_failed(
    node_config: NodeConfig,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    fast_timing: Timing,
) -> None:
    # Not a GGUF file: llama-server really starts, fails to load it and exits, every time.
    junk = b"GGUF-not-really" * 100
    weights = WeightsSpec(
        url=files.add_file("junk.gguf", junk), sha256=hashlib.sha256(junk).hexdigest(), size=len(junk)
    )
    async with installed_node(node_config, files, engine_archive, fast_timing) as svc:
        ack = await svc.handle(
            StartReplica(id="c1", fencing_token=1, replica=replica_spec("bad", weights, free_port(), max_restarts=3))
        )
        assert ack.ok
        seen: list[ReplicaState] = []
        final = await next_replica_state(svc, "bad", lambda s: s.status == "failed", seen=seen)
    restarts = [s.detail for s in seen if s.status == "starting" and "restart" in s.detail]
    # Exponential: base 0.05 s, doubling, capped at 0.4 s by fast_timing.
    assert [d.split("; ", 1)[1] for d in restarts] == [
        "restart 1 of 3 in 0.05 s",
        "restart 2 of 3 in 0.1 s",
        "restart 3 of 3 in 0.2 s",
    ]
    assert all(d.startswith("crashed while starting: exited with status 1") for d in restarts)
    assert final.detail == "crashed while starting: exited with status 1; gave up after 3 restarts"
    assert final.restarts == 4
    # Each crash report carries the engine's last words, so the operator sees why.
    assert any("failed to load model" in line or "gguf" in line.lower() for line in final.last_lines), final.last_lines


async def test_killed_engine_is_restarted_and_ready_again(
    node_config: NodeConfig,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    tiny_model: Path,
    fast_timing: Timing,
) -> None:
    async with installed_node(node_config, files, engine_archive, fast_timing) as svc:
        await svc.handle(
            StartReplica(
                id="c1", fencing_token=1, replica=replica_spec("tiny-k", served_weights(files, tiny_model), free_port())
            )
        )
        first = await next_replica_state(svc, "tiny-k", lambda s: s.status == "ready")
        os.killpg(first.pid, signal.SIGKILL)
        seen: list[ReplicaState] = []
        again = await next_replica_state(svc, "tiny-k", lambda s: s.status == "ready" and s.pid != first.pid, seen=seen)
        assert again.pid != first.pid
        crash = next(s for s in seen if "restart" in s.detail)
        assert crash.detail == "crashed: exited with signal 9; restart 1 of 3 in 0.05 s"
        assert crash.restarts == 1
        await svc.stop_engines()


@pytest.mark.slow  # left out of the quick tier: a request in flight through a drain
async def test_drain_waits_for_the_request_in_flight(
    node_config: NodeConfig,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    tiny_model: Path,
    fast_timing: Timing,
) -> None:
    async with installed_node(node_config, files, engine_archive, fast_timing) as svc:
        port = free_port()
        spec = replica_spec(
            "tiny-d",
            served_weights(files, tiny_model),
            port,
            args=["-t", "1", "-c", "2048", "-np", "1", "--metrics", "--alias", "tiny"],
        )
        await svc.handle(StartReplica(id="c1", fencing_token=1, replica=spec))
        ready = await next_replica_state(svc, "tiny-d", lambda s: s.status == "ready")
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=spec.api_key, max_retries=0)
        seen: list[ReplicaState] = []
        finish: list[str | None] = []
        tokens = 0
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "go"}], max_tokens=2000, stream=True
        )
        async with stream:
            async for chunk in stream:
                if tokens == 0:
                    ack = await svc.handle(DrainReplica(id="c2", fencing_token=1, replica_id="tiny-d", timeout_s=30))
                    assert ack.ok
                if chunk.choices and chunk.choices[0].delta.content:
                    tokens += 1
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish.append(chunk.choices[0].finish_reason)
        # The whole answer arrived: the drain did not cut the request.
        assert finish == ["length"] and tokens > 1000
        await next_replica_state(svc, "tiny-d", lambda s: s.status == "stopped", seen=seen)
        assert "waiting for 1 request(s) in flight" in [s.detail for s in seen if s.status == "draining"]
        assert start_ticks(ready.pid) is None


async def test_engines_survive_a_daemon_restart_and_are_adopted(
    node_config: NodeConfig,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    tiny_model: Path,
    fast_timing: Timing,
) -> None:
    port = free_port()
    spec = replica_spec("tiny-a", served_weights(files, tiny_model), port)
    async with installed_node(node_config, files, engine_archive, fast_timing) as svc:
        await svc.handle(StartReplica(id="c1", fencing_token=1, replica=spec))
        first = await next_replica_state(svc, "tiny-a", lambda s: s.status == "ready")
    # The daemon is gone; the engine is not.
    assert start_ticks(first.pid) is not None
    state_file = Path(node_config.data_dir) / "shards.json"
    assert oct(state_file.stat().st_mode & 0o777) == "0o600"  # it holds the replica's API key

    async with installed_node(node_config, files, engine_archive, fast_timing) as svc:
        adopted = await next_replica_state(svc, "tiny-a", lambda s: s.status in ("ready", "failed"))
        assert adopted.status == "ready" and adopted.pid == first.pid
        assert [s.replica_id for s in svc.hello().replicas] == ["tiny-a"]
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=spec.api_key, max_retries=0)
        reply = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "still there?"}], max_tokens=4
        )
        assert reply.choices[0].message.content
        # An adopted engine that crashes is restarted like any other.
        os.killpg(first.pid, signal.SIGKILL)
        # (A measurement of the adopted engine may be reported before the kill is seen: it is the
        # restarted engine's ready that is awaited.)
        again = await next_replica_state(svc, "tiny-a", lambda s: s.status == "ready" and s.pid != first.pid)
        assert again.pid != first.pid
        assert svc.supervisor.output("tiny-a")  # its output is kept for the operator

    # A daemon told not to adopt stops what it finds instead of leaving an orphan.
    async with installed_node(node_config, files, engine_archive, fast_timing, adopt=False) as svc:
        assert svc.replica_states() == []
    assert start_ticks(again.pid) is None


async def test_a_reused_pid_is_not_mistaken_for_the_engine(
    node_config: NodeConfig,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    fast_timing: Timing,
) -> None:
    from llmgw_node.procs import ProcessRecord, StateFile

    # A record naming a live process (this test's own pid) with a different start time: that is
    # pid reuse, and the node must neither adopt nor signal it.
    spec = replica_spec("ghost", WeightsSpec(url="/nonexistent", sha256="0" * 64, size=1), free_port())
    StateFile(Path(node_config.data_dir) / "shards.json").save(
        [
            ProcessRecord(
                replica_id="ghost",
                pid=os.getpid(),
                ticks=(start_ticks(os.getpid()) or 0) + 1,
                binary="/bin/false",
                weights="/nonexistent",
                log="/dev/null",
                spec=spec,
            )
        ]
    )
    async with installed_node(node_config, files, engine_archive, fast_timing) as svc:
        assert svc.replica_states() == []


async def test_periodic_recheck_repairs_a_broken_install(
    node_config: NodeConfig,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    fast_timing: Timing,
) -> None:
    config = attrs.evolve(node_config, recheck_interval_s=0.3)
    async with installed_node(config, files, engine_archive, fast_timing) as svc:
        binary = svc.engines.binary("llama.cpp", TAG)
        assert binary is not None
        await trio.Path(binary.with_name("libggml.so.0")).unlink()
        broken = await next_engine_state(svc, lambda s: s.status == "failed")
        assert broken.describe() == "failed: re-check: missing library: libggml.so.0"
        repaired = await next_engine_state(svc, lambda s: s.status in ("installed", "failed"))
        assert repaired.describe() == f"installed {TAG}"
        assert await trio.Path(binary.with_name("libggml.so.0")).exists()


async def test_replica_started_while_its_engine_installs_waits_then_runs(
    node_config: NodeConfig,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    tiny_model: Path,
    fast_timing: Timing,
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    async with open_node_service(node_config, timing=fast_timing) as svc:
        ack = await svc.handle(
            SetEngines(id="e", fencing_token=1, engines=[EngineSpec("llama.cpp", TAG, files.release_api())])
        )
        assert ack.ok
        spec = replica_spec("early", served_weights(files, tiny_model), free_port())
        ack = await svc.handle(StartReplica(id="s", fencing_token=1, replica=spec))
        assert ack.ok, ack.error
        seen: list[ReplicaState] = []
        ready = await next_replica_state(svc, "early", lambda s: s.status in ("ready", "failed"), seen=seen)
        assert ready.status == "ready", ready.describe()
        waiting = [s.detail for s in seen if s.status == "pending"]
        # The node says, in its own words, what the replica waits for.
        assert waiting and waiting[0].startswith("waiting for engine: installing: ")
        await svc.stop_engines()


@pytest.mark.slow  # left out of the quick tier: waits out the hang watchdog
async def test_a_hung_engine_is_killed_and_restarted(
    node_config: NodeConfig,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    tiny_model: Path,
    fast_timing: Timing,
) -> None:
    async with installed_node(node_config, files, engine_archive, fast_timing) as svc:
        await svc.handle(
            StartReplica(
                id="c1", fencing_token=1, replica=replica_spec("tiny-h", served_weights(files, tiny_model), free_port())
            )
        )
        first = await next_replica_state(svc, "tiny-h", lambda s: s.status == "ready")
        # A stopped process exits nothing and closes nothing: only the health polling notices.
        os.kill(first.pid, signal.SIGSTOP)
        seen: list[ReplicaState] = []
        again = await next_replica_state(svc, "tiny-h", lambda s: s.status == "ready" and s.pid != first.pid, seen=seen)
        assert again.pid != first.pid
        assert start_ticks(first.pid) is None  # the hung one was killed, not left behind
        assert any(s.detail.startswith("hung: no answer on /health 3 times in a row; restart 1 of 3") for s in seen), [
            s.detail for s in seen
        ]
        await svc.stop_engines()
