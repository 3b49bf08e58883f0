"""A replica runs on the GPUs control placed it on: CUDA_VISIBLE_DEVICES and llama-server's split flags.

A scripted nvidia-smi reports two GPUs (this machine has none) and a fake engine records the
environment and arguments it was started with.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs
import pytest
import trio
from node.helpers import local_weights, next_replica_state, replica_spec

from llmgw_dev.engine_proc import free_port
from llmgw_node.config import ConfiguredEngine, NodeConfig
from llmgw_node.service import open_node_service
from llmgw_node.supervisor import Timing
from llmgw_shared.wire import ReplicaState, StartReplica, WeightsSpec
from support.waiting import wait_until

NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=*)
    echo '0, NVIDIA L4, GPU-00000000-0000-1111-2222-333344445555, 23034, 22700, 550.54.15'
    echo '1, NVIDIA L4, GPU-11111111-0000-1111-2222-333344445555, 23034, 22700, 550.54.15' ;;
  *--query-compute-apps=*) ;;
  *) echo "unexpected arguments: $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bindir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")


@pytest.fixture
def recording_engine(tmp_path: Path, node_config: NodeConfig) -> tuple[NodeConfig, Path]:
    record = tmp_path / "engine-started-with"
    script = tmp_path / "fake-llama-server"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "--version" ]; then echo 'version: 1 (build 1, commit x)' >&2; exit 0; fi
{{ echo "CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES-unset}}"; for a in "$@"; do echo "$a"; done; }} > {record}.tmp
mv {record}.tmp {record}
exec sleep 30
""")
    script.chmod(0o755)
    config = attrs.evolve(node_config, engines=[ConfiguredEngine(name="llama.cpp", path=str(script), version="b11312")])
    return config, record


def _weights(tmp_path: Path) -> WeightsSpec:
    data = b"weights" * 100
    (tmp_path / "w.gguf").write_bytes(data)
    return WeightsSpec(url=str(tmp_path / "w.gguf"), sha256=hashlib.sha256(data).hexdigest(), size=len(data))


async def _started_with(record: Path) -> list[str]:
    path = trio.Path(record)
    await wait_until(path.exists, timeout=10)
    return (await path.read_text()).splitlines()


@pytest.mark.usefixtures("gpu_host")
async def test_a_replica_split_over_two_gpus(
    tmp_path: Path, recording_engine: tuple[NodeConfig, Path], fast_timing: Timing
) -> None:
    config, record = recording_engine
    spec = attrs.evolve(replica_spec("g2", _weights(tmp_path), free_port(), args=["-t", "1"]), devices=[1, 0])
    async with open_node_service(config, timing=fast_timing) as svc:
        assert [g.index for g in svc.facts.gpus] == [0, 1]
        ack = await svc.handle(StartReplica(id="1", fencing_token=1, replica=spec))
        assert ack.ok, ack.error
        lines = await _started_with(record)
        assert lines[0] == "CUDA_VISIBLE_DEVICES=1,0"
        args = lines[1:]
        assert args[args.index("--n-gpu-layers") + 1] == "999"
        assert args[args.index("--split-mode") + 1] == "layer"
        assert args[args.index("--tensor-split") + 1] == "1,1"
        assert args[args.index("--main-gpu") + 1] == "0"
        # The profile's own flags come after llmgw's, so a profile can override them.
        assert args[-2:] == ["-t", "1"]
        await svc.stop_engines(0.5)


@pytest.mark.usefixtures("gpu_host")
async def test_one_gpu_and_no_gpu(
    tmp_path: Path, recording_engine: tuple[NodeConfig, Path], fast_timing: Timing
) -> None:
    config, record = recording_engine
    async with open_node_service(config, timing=fast_timing) as svc:
        one = attrs.evolve(replica_spec("g1", _weights(tmp_path), free_port(), args=[]), devices=[1])
        assert (await svc.handle(StartReplica(id="1", fencing_token=1, replica=one))).ok
        lines = await _started_with(record)
        assert lines[0] == "CUDA_VISIBLE_DEVICES=1" and "--split-mode" not in lines and "--tensor-split" not in lines
        await next_replica_state(svc, "g1", lambda s: s.status == "starting")
        await svc.stop_engines(0.5)
        record.unlink()
        none = replica_spec("g0", _weights(tmp_path), free_port(), args=[])
        assert (await svc.handle(StartReplica(id="2", fencing_token=1, replica=none))).ok
        lines = await _started_with(record)
        assert lines[0] == "CUDA_VISIBLE_DEVICES=unset" and "--n-gpu-layers" not in lines
        await svc.stop_engines(0.5)


@pytest.mark.usefixtures("gpu_host")
async def test_devices_the_node_does_not_have_are_refused(
    tmp_path: Path, recording_engine: tuple[NodeConfig, Path], fast_timing: Timing
) -> None:
    config, record = recording_engine
    async with open_node_service(config, timing=fast_timing) as svc:
        for devices, words in [
            ([2], "GPU device(s) 2 are not on this node (it has: 0, 1)"),
            ([0, 0], "name a GPU twice"),
        ]:
            spec = attrs.evolve(replica_spec("bad", _weights(tmp_path), free_port()), devices=devices)
            ack = await svc.handle(StartReplica(id="1", fencing_token=1, replica=spec))
            assert not ack.ok and words in ack.error
        assert svc.replica_states() == [] and not record.exists()


@pytest.mark.usefixtures("gpu_host")
async def test_a_gpu_replica_that_offloads_nothing_is_failed_not_published(
    tmp_path: Path, node_config: NodeConfig, llama_server_binary: Path, tiny_model: Path, fast_timing: Timing
) -> None:
    # The real CPU build on a node that reports GPUs: placed on GPU 0 it answers /health like any
    # engine, but its log has no "offloaded N/M layers to GPU" line. It used to be published
    # ready (a GPU profile at CPU speed); now it is failed, with the engine's output, and not restarted.
    config = attrs.evolve(
        node_config, engines=[ConfiguredEngine(name="llama.cpp", path=str(llama_server_binary), version="b11312")]
    )
    spec = attrs.evolve(replica_spec("cpu-as-gpu", local_weights(tiny_model), free_port()), devices=[0])
    async with open_node_service(config, timing=fast_timing) as svc:
        assert (await svc.handle(StartReplica(id="1", fencing_token=1, replica=spec))).ok
        seen: list[ReplicaState] = []
        state = await next_replica_state(svc, "cpu-as-gpu", lambda s: s.status in ("ready", "failed"), seen=seen)
        assert state.status == "failed", state
        assert state.detail.startswith("placed on GPU(s) 0 but the engine offloaded nothing")
        assert state.restarts == 0 and all(s.status != "ready" for s in seen)
        await svc.stop_engines(0.5)
