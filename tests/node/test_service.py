"""NodeService command handling: acks, refusals, fencing, weights removal, hello contents."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import attrs
import pytest
import trio
from node.helpers import drain_reports, next_replica_state, replica_spec

from llmgw_dev.engine_proc import free_port
from llmgw_node.config import ConfiguredEngine, NodeConfig
from llmgw_node.engines.proof import ProofError, engine_version
from llmgw_node.procs import start_ticks
from llmgw_node.service import open_node_service
from llmgw_node.supervisor import Timing
from llmgw_shared.wire import (
    EngineSpec,
    RemoveWeights,
    SetEngines,
    StartReplica,
    StopReplica,
    WeightsSpec,
)
from support.waiting import wait_until


@pytest.fixture
def fake_llama(tmp_path: Path) -> Path:
    # Stands in for an engine binary in tests about command handling, where no engine runs.
    script = tmp_path / "fake-llama-server"
    script.write_text("#!/bin/sh\necho 'version: 1 (build 1, commit x)' >&2\n")
    script.chmod(0o755)
    return script


@pytest.fixture
def config(node_config: NodeConfig, fake_llama: Path) -> NodeConfig:
    return attrs.evolve(
        node_config, engines=[ConfiguredEngine(name="llama.cpp", path=str(fake_llama), version="b11312")]
    )


def weights_file(tmp_path: Path, data: bytes = b"weights" * 100, name: str = "w.gguf") -> WeightsSpec:
    path = tmp_path / name
    path.write_bytes(data)
    return WeightsSpec(url=str(path), sha256=hashlib.sha256(data).hexdigest(), size=len(data))


async def test_hello_reports_facts_engines_and_no_secrets_in_repr(config: NodeConfig, fast_timing: Timing) -> None:
    async with open_node_service(config, timing=fast_timing) as svc:
        hello = svc.hello()
    assert hello.node_id == "test-node" and hello.join_token == "llmgw-join-secret"
    assert hello.facts.probed and hello.facts.cores > 0
    assert [e.describe() for e in hello.engines] == ["configured b11312"]
    assert hello.replicas == []
    assert "llmgw-join-secret" not in repr(config)


async def test_stale_fencing_token_is_refused(config: NodeConfig, fast_timing: Timing) -> None:
    async with open_node_service(config, timing=fast_timing) as svc:
        assert (await svc.handle(StopReplica(id="a", fencing_token=5, replica_id="x"))).ok
        ack = await svc.handle(StopReplica(id="b", fencing_token=4, replica_id="x"))
    assert not ack.ok and ack.command_id == "b"
    assert ack.error.startswith("stale fencing token 4 (this node has seen 5)")


async def test_start_refusals_name_the_problem(tmp_path: Path, config: NodeConfig, fast_timing: Timing) -> None:
    w = weights_file(tmp_path)
    async with open_node_service(config, timing=fast_timing) as svc:
        bad_id = await svc.handle(StartReplica(id="1", fencing_token=1, replica=replica_spec("../etc", w, 9000)))
        assert "replica id '../etc'" in bad_id.error
        other = await svc.handle(
            StartReplica(
                id="2",
                fencing_token=1,
                replica=attrs.evolve(
                    replica_spec("s", w, 9000), engine="vllm", weights=None, model_dir="/srv/models/m"
                ),
            )
        )
        assert other.error == "engine vllm b11312 is not available here: absent"
        # vLLM and SGLang serve a directory: one file and no directory is refused, as are both.
        file_only = await svc.handle(
            StartReplica(id="2b", fencing_token=1, replica=attrs.evolve(replica_spec("s", w, 9000), engine="vllm"))
        )
        assert file_only.error == "replica s: vllm serves a model directory (model_dir)"
        both = await svc.handle(
            StartReplica(id="2c", fencing_token=1, replica=attrs.evolve(replica_spec("s", w, 9000), model_dir="/m"))
        )
        assert both.error == "replica s: names weights or a model_dir, not both or neither"
        for bad in ("relative/dir", "/srv/../etc", "hub:no-slash", "hub:a/b@c d", "/x\n"):
            refused = await svc.handle(
                StartReplica(
                    id="2d",
                    fencing_token=1,
                    replica=attrs.evolve(replica_spec("s", w, 9000), engine="vllm", weights=None, model_dir=bad),
                )
            )
            assert not refused.ok and refused.error.startswith("replica s: "), refused.error
        # An engine named by path that this node's config does not name: not configured here, not failed.
        await svc.handle(SetEngines(id="3", fencing_token=1, engines=[EngineSpec("sglang", "1")]))
        unknown = [e for e in svc.engine_states() if e.name == "sglang"]
        assert unknown[0].status == "unconfigured" and unknown[0].describe() == "not configured here"


async def test_port_in_use_and_port_conflicts(tmp_path: Path, config: NodeConfig, fast_timing: Timing) -> None:
    w = weights_file(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        async with open_node_service(config, timing=fast_timing) as svc:
            ack = await svc.handle(StartReplica(id="1", fencing_token=1, replica=replica_spec("a", w, port)))
            assert ack.ok
            state = await next_replica_state(svc, "a", lambda s: s.status == "failed")
            assert state.detail == f"port {port} on 127.0.0.1 is in use by another process"
            # A second replica on a port a live replica holds is refused at once.
            free = free_port()
            w2 = weights_file(tmp_path, b"other", "w2.gguf")
            await svc.handle(
                StartReplica(id="2", fencing_token=1, replica=attrs.evolve(replica_spec("b", w, free), weights=w2))
            )
            ack = await svc.handle(StartReplica(id="3", fencing_token=1, replica=replica_spec("c", w, free)))
            assert ack.error == f"port {free} is already used by replica b"


async def test_replica_with_wrong_weights_fails_with_the_reason(
    tmp_path: Path, config: NodeConfig, fast_timing: Timing
) -> None:
    w = attrs.evolve(weights_file(tmp_path), sha256="e" * 64)
    async with open_node_service(config, timing=fast_timing) as svc:
        assert (await svc.handle(StartReplica(id="1", fencing_token=1, replica=replica_spec("a", w, free_port())))).ok
        state = await next_replica_state(svc, "a", lambda s: s.status == "failed")
    assert "differs from the expected " + "e" * 64 in state.detail


async def test_remove_weights_refuses_files_in_use(tmp_path: Path, config: NodeConfig, fast_timing: Timing) -> None:
    async with open_node_service(config, timing=fast_timing) as svc:
        sha = "d" * 64
        svc.weights.acquire(sha, "running-shard")
        ack = await svc.handle(RemoveWeights(id="r", fencing_token=1, sha256=[sha, "c" * 64]))
        assert not ack.ok and ack.error == "kept 1 file(s) a running replica uses: dddddddddddd"
        svc.weights.give_back(sha, "running-shard")
        assert (await svc.handle(RemoveWeights(id="r2", fencing_token=1, sha256=[sha]))).ok
        drain_reports(svc)


async def test_stubborn_engine_gets_sigkill_after_the_grace_period(
    tmp_path: Path, node_config: NodeConfig, fast_timing: Timing, caplog: pytest.LogCaptureFixture
) -> None:
    script = tmp_path / "stubborn"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = "--version" ]; then echo "stubborn 1"; exit 0; fi\n'
        "trap '' TERM\nwhile true; do sleep 0.05; done\n"
    )
    script.chmod(0o755)
    config = attrs.evolve(node_config, engines=[ConfiguredEngine(name="stubborn", path=str(script), version="1")])
    spec = attrs.evolve(
        replica_spec("s", weights_file(tmp_path), free_port(), args=["{port}"]), engine="stubborn", engine_version="1"
    )
    async with open_node_service(config, timing=fast_timing) as svc:
        assert (await svc.handle(StartReplica(id="1", fencing_token=1, replica=spec))).ok
        starting = await next_replica_state(svc, "s", lambda s: s.status == "starting")
        assert starting.pid
        with trio.fail_after(5):
            assert (await svc.handle(StopReplica(id="2", fencing_token=1, replica_id="s", grace_s=0.3))).ok
            stopped = await next_replica_state(svc, "s", lambda s: s.status == "stopped")
    assert stopped.status == "stopped"
    assert start_ticks(starting.pid) is None
    assert f"pid {starting.pid} did not stop within 0.3 s of SIGTERM; sending SIGKILL" in caplog.text


async def test_version_that_hangs_is_cut_off(tmp_path: Path) -> None:
    script = tmp_path / "hangs"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    with pytest.raises(ProofError, match=r"hangs --version did not finish within 0\.3 s"):
        await engine_version(script, time_limit=0.3)


async def test_an_engine_on_path_is_not_reported(
    tmp_path: Path, node_config: NodeConfig, fast_timing: Timing, monkeypatch: pytest.MonkeyPatch, fake_llama: Path
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "llama-server").symlink_to(fake_llama)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    async with open_node_service(node_config, timing=fast_timing) as svc:
        # Found by chance is not installed: an empty list here means "has none".
        assert svc.engine_states() == []
        assert svc.hello().engines == []


async def test_what_a_crashed_engine_forked_dies_with_it(
    tmp_path: Path, node_config: NodeConfig, fast_timing: Timing
) -> None:
    # vLLM-style: the server forks workers (holding GPU memory, the port) and then dies; the
    # workers must not outlive it, or the restart finds the port taken and the GPU full.
    child = tmp_path / "child"
    script = tmp_path / "forking"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = "--version" ]; then echo "forking 1"; exit 0; fi\n'
        f"sleep 300 &\necho $! > {child}\nexit 1\n"
    )
    script.chmod(0o755)
    config = attrs.evolve(node_config, engines=[ConfiguredEngine(name="forking", path=str(script), version="1")])
    spec = attrs.evolve(
        replica_spec("f", weights_file(tmp_path), free_port(), args=["{port}"], max_restarts=0),
        engine="forking",
        engine_version="1",
    )
    async with open_node_service(config, timing=fast_timing) as svc:
        assert (await svc.handle(StartReplica(id="1", fencing_token=1, replica=spec))).ok
        failed = await next_replica_state(svc, "f", lambda s: s.status == "failed")
    assert failed.detail.startswith("crashed while starting: exited with status 1")
    pid = int(child.read_text())
    await wait_until(lambda: start_ticks(pid) is None, timeout=10, interval=0.02)


async def test_remove_weights_with_a_path_is_refused_in_the_ack(
    tmp_path: Path, config: NodeConfig, fast_timing: Timing
) -> None:
    victim = Path(config.data_dir) / "victim"
    async with open_node_service(config, timing=fast_timing) as svc:
        victim.write_text("state")
        ack = await svc.handle(RemoveWeights(id="r", fencing_token=1, sha256=["../victim", "../shards"]))
        assert not ack.ok and ack.error.startswith("remove_weights: sha256 '../victim' is not valid")
        assert victim.exists()
        # Still serving commands.
        assert (await svc.handle(StopReplica(id="s", fencing_token=1, replica_id="nothing"))).ok


@pytest.mark.parametrize("replica_id", ["tiny\n", "../etc", ".hidden", "a/b", "x" * 129])
async def test_a_replica_id_that_is_not_one_file_name_is_refused(
    tmp_path: Path, config: NodeConfig, fast_timing: Timing, replica_id: str
) -> None:
    async with open_node_service(config, timing=fast_timing) as svc:
        ack = await svc.handle(
            StartReplica(id="1", fencing_token=1, replica=replica_spec(replica_id, weights_file(tmp_path), free_port()))
        )
    assert not ack.ok and ack.error.startswith("replica id ") and "is not valid: use 1-128 letters" in ack.error
