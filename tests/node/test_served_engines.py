"""vLLM and SGLang on a node, through fakes that speak their command lines, health and metrics:
started by each one's conventions, served, drained while requests are in flight (issue 19)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import httpx2
import openai
import pytest
import trio
from node.helpers import next_engine_state, next_replica_state

from llmgw_dev.engine_proc import free_port
from llmgw_node.config import ConfiguredEngine, NodeConfig
from llmgw_node.service import NodeService, open_node_service
from llmgw_node.supervisor import Timing
from llmgw_shared.wire import DrainReplica, EngineSpec, ReplicaSpec, ReplicaState, SetEngines, StartReplica
from support.served_engines import VERSIONS, engines_config, hub_snapshot, model_directory
from support.waiting import wait_until

# Left out of the quick tier (slow: vLLM and SGLang stand-ins started as processes).
pytestmark = pytest.mark.slow


@pytest.fixture
def served_config(node_config: NodeConfig, tmp_path: Path) -> NodeConfig:
    engines = [ConfiguredEngine(**e) for e in engines_config(tmp_path / "bin")]  # type: ignore[arg-type]
    return attrs.evolve(node_config, engines=engines, model_roots=[str(tmp_path / "models")])


def spec(
    engine: str, model_dir: str, *, env: dict[str, str] | None = None, args: list[str] | None = None
) -> ReplicaSpec:
    served = "qwen-test"
    extra = (
        ["--served-model-name", served, "--max-model-len", "4096"]
        if engine == "vllm"
        else ["--served-model-name", served, "--context-length", "4096", "--enable-metrics"]
    )
    return ReplicaSpec(
        replica_id=f"{engine}-0",
        engine=engine,
        engine_version=VERSIONS[engine],
        weights=None,
        port=free_port(),
        api_key=f"sk-{engine}-shard",
        args=[*extra, *(args or [])],
        env=env or {},
        start_timeout_s=30.0,
        max_restarts=0,
        model_dir=model_dir,
    )


async def configured(svc: NodeService) -> None:
    await svc.handle(
        SetEngines(
            id="e",
            fencing_token=1,
            engines=[EngineSpec("vllm", VERSIONS["vllm"]), EngineSpec("sglang", VERSIONS["sglang"])],
        )
    )
    for name in ("vllm", "sglang"):
        state = svc.engines.state(name, VERSIONS[name])
        assert state.status == "configured", state.describe()


@pytest.mark.slow  # left out of the quick tier: engine processes started and drained
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_started_by_its_conventions_served_and_drained_with_a_request_in_flight(
    engine: str,
    served_config: NodeConfig,
    tmp_path: Path,
    fast_timing: Timing,
) -> None:
    if engine == "vllm":
        model_dir = str(model_directory(tmp_path / "models" / "qwen"))
    else:
        model_dir = hub_snapshot(served_config.data_path / "hub", "Qwen/Qwen2.5-0.5B-Instruct")
    replica = spec(engine, model_dir, env={"FAKE_ENGINE_CHUNKS": "15", "FAKE_ENGINE_CHUNK_DELAY": "0.1"})
    async with open_node_service(served_config, timing=fast_timing) as svc:
        await configured(svc)
        ack = await svc.handle(StartReplica(id="s", fencing_token=1, replica=replica))
        assert ack.ok, ack.error
        ready = await next_replica_state(svc, replica.replica_id, lambda s: s.status in ("ready", "failed"))
        assert ready.status == "ready", (ready.describe(), ready.last_lines)
        cmdline = (await trio.Path(f"/proc/{ready.pid}/cmdline").read_bytes()).split(b"\0")
        words = [w.decode() for w in cmdline if w]
        # Each engine's own command line (after the fake's interpreter and module).
        tail = words[words.index(engine) + 1 :]
        if engine == "vllm":
            assert tail[:2] == ["serve", model_dir]  # already real: tmp_path has no symlinks
            assert replica.api_key.encode() not in b" ".join(cmdline)  # VLLM_API_KEY, not argv
        else:
            assert tail[:4] == [
                "-m",
                "sglang.launch_server",
                "--model-path",
                str(
                    served_config.data_path
                    / "hub"
                    / "models--Qwen--Qwen2.5-0.5B-Instruct"
                    / "snapshots"
                    / "0123456789abcdef0123456789abcdef01234567"
                ),
            ]
        assert tail[tail.index("--port") + 1] == str(replica.port) and tail[tail.index("--host") + 1] == "127.0.0.1"

        base = f"http://127.0.0.1:{replica.port}"
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=replica.api_key, max_retries=0)
        reply = await client.chat.completions.create(model="qwen-test", messages=[{"role": "user", "content": "hi"}])
        assert reply.model == "qwen-test" and reply.choices[0].message.content
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()

        # A stream of 15 tokens at 0.1 s each is in flight when the drain comes: the node sees it in
        # the engine's metrics and waits for it; the client gets every token and [DONE].
        chunks: list[str] = []
        done = trio.Event()

        async def stream() -> None:
            async with (
                httpx2.AsyncClient(timeout=30) as http,
                http.stream(
                    "POST",
                    base + "/v1/chat/completions",
                    headers={"authorization": f"Bearer {replica.api_key}"},
                    json={"model": "qwen-test", "stream": True, "messages": [{"role": "user", "content": "x"}]},
                ) as response,
            ):
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        chunks.append(line[6:])
            done.set()

        seen: list[ReplicaState] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream)
            await wait_until(lambda: chunks, timeout=10, interval=0.02)
            assert (
                await svc.handle(DrainReplica(id="d", fencing_token=1, replica_id=replica.replica_id, timeout_s=30))
            ).ok
            stopped = await next_replica_state(
                svc, replica.replica_id, lambda s: s.status in ("stopped", "failed"), seen=seen
            )
            assert done.is_set(), "the engine was stopped before its request finished"
        assert stopped.status == "stopped"
        assert "waiting for 1 request(s) in flight" in [s.detail for s in seen]
        assert chunks[-1] == "[DONE]"
        tokens = [json.loads(c)["choices"][0]["delta"].get("content") for c in chunks[:-1]]
        assert len([t for t in tokens if t]) == 15


async def test_model_directories_are_checked_against_the_nodes_roots(
    served_config: NodeConfig,
    tmp_path: Path,
    fast_timing: Timing,
) -> None:
    outside = model_directory(tmp_path / "elsewhere" / "m")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "link").symlink_to(outside)  # inside by name, outside by where it leads
    async with open_node_service(served_config, timing=fast_timing) as svc:
        await configured(svc)
        for replica_id, model_dir, words in (
            ("a", str(outside), "outside this node's model_roots"),
            ("b", str(tmp_path / "models" / "link"), "outside this node's model_roots"),
            ("c", str(tmp_path / "models" / "missing"), "does not exist on this node"),
            ("d", "hub:Qwen/Absent@main", "has no snapshot of Qwen/Absent at main"),
        ):
            replica = attrs.evolve(spec("vllm", model_dir), replica_id=replica_id)
            assert (await svc.handle(StartReplica(id=replica_id, fencing_token=1, replica=replica))).ok
            failed = await next_replica_state(svc, replica_id, lambda s: s.status in ("ready", "failed"))
            assert failed.status == "failed" and words in failed.detail, failed.describe()
        # A directory that is not a model: the engine itself refuses, and its words come with the failure.
        empty = tmp_path / "models" / "empty"
        empty.mkdir()
        replica = attrs.evolve(spec("vllm", str(empty)), replica_id="e")
        assert (await svc.handle(StartReplica(id="e", fencing_token=1, replica=replica))).ok
        failed = await next_replica_state(svc, "e", lambda s: s.status == "failed")
        assert any("No config.json found" in line for line in failed.last_lines), failed.last_lines


async def test_an_engine_the_node_lacks_is_not_configured_here(node_config: NodeConfig, fast_timing: Timing) -> None:
    async with open_node_service(node_config, timing=fast_timing) as svc:
        await svc.handle(SetEngines(id="e", fencing_token=1, engines=[EngineSpec("vllm", "0.9.1")]))
        state = await next_engine_state(svc, lambda s: s.name == "vllm")
        assert state.status == "unconfigured" and state.describe() == "not configured here"


async def test_an_adopted_sglang_engine_restarts_with_the_same_snapshot(
    served_config: NodeConfig,
    fast_timing: Timing,
) -> None:
    import os
    import signal

    from llmgw_node.procs import start_ticks

    replica = spec("sglang", hub_snapshot(served_config.data_path / "hub", "Qwen/Qwen2.5-0.5B-Instruct"))
    replica = attrs.evolve(replica, max_restarts=3)
    async with open_node_service(served_config, timing=fast_timing) as svc:
        await configured(svc)
        assert (await svc.handle(StartReplica(id="s", fencing_token=1, replica=replica))).ok
        first = await next_replica_state(svc, replica.replica_id, lambda s: s.status in ("ready", "failed"))
        assert first.status == "ready", first.last_lines
    assert start_ticks(first.pid) is not None  # the daemon went; the engine stayed
    try:
        async with open_node_service(served_config, timing=fast_timing) as svc:
            adopted = await next_replica_state(svc, replica.replica_id, lambda s: s.status in ("ready", "failed"))
            assert adopted.status == "ready" and adopted.pid == first.pid
            # It crashes: started again from the recorded, resolved snapshot (not "hub:..." as a path).
            os.killpg(first.pid, signal.SIGKILL)
            again = await next_replica_state(
                svc, replica.replica_id, lambda s: s.status in ("ready", "failed") and s.pid != first.pid
            )
            assert again.status == "ready", (again.describe(), again.last_lines)
            await svc.stop_engines(grace=3)
    finally:
        if start_ticks(first.pid) is not None:
            os.killpg(first.pid, signal.SIGKILL)
