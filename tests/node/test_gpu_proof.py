"""A GPU build is installed only when it lists the node's GPUs through its backend.

No GPU here: scripted ``llama-server`` builds answer ``--version`` and ``--list-devices`` as the
real ones do (the real CPU build's refusal is in test_engine_install), a compiled backend plugin
stands in for ``libggml-cuda.so``, and the load-log check reads logs in llama.cpp's words.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import httpx2
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from node.conftest import TAG
from node.release_server import FileServer

from llmgw_node import gpu_probe
from llmgw_node.engines.manager import EngineManager
from llmgw_node.engines.proof import parse_list_devices
from llmgw_node.engines.release import Platform
from llmgw_node.offload import offload_problem, offloaded_layers
from llmgw_shared.wire import EngineSpec
from support.waiting import wait_until

L4 = "  CUDA0: NVIDIA L4 (22491 MiB, 22004 MiB free)\\n  CUDA1: NVIDIA L4 (22491 MiB, 22004 MiB free)\\n"
CUDA_NODE = Platform(os="linux", arch="x86_64", cuda=True, nvidia_driver="550.54.15", gpu_backend="cuda", gpus=(0, 1))
VULKAN_NODE = Platform(os="linux", arch="x86_64", vulkan=True, gpu_backend="vulkan", gpus=(0,))
CUDA_ASSET = f"llama-{TAG}-bin-ubuntu-cuda-12.8-x64.tar.gz"
CUDART_ASSET = f"cudart-llama-{TAG}-bin-ubuntu-cuda-12.8-x64.tar.gz"


def _script_archive(tmp_path: Path, devices: str, *, said: str = "", extra: dict[str, bytes] | None = None) -> bytes:
    """A release archive whose llama-server records its device variables and prints ``devices``."""
    record = tmp_path / "list-devices-env"
    script = f"""#!/bin/sh
case "$1" in
  --version) echo 'version: 11312 (0c1e57098)' >&2; echo 'built with cc for x86_64-linux-gnu' >&2; exit 0 ;;
  --list-devices)
    env | grep -E '^(CUDA_VISIBLE|HIP_VISIBLE|GGML_VK_VISIBLE)_DEVICES=|^CUDA_DEVICE_ORDER=' | sort > {record}
    printf '{said}'
    printf 'Available devices:\\n{devices}'
    exit 0 ;;
esac
exit 1
"""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in {"llama-server": script.encode(), **(extra or {})}.items():
            info = tarfile.TarInfo(f"llama-{TAG}/{name}")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _cudart() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:  # flat, as upstream's cudart archives are
        for name in ("libcudart.so.12", "libcublas.so.12"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"\x7fELF"))
    return out.getvalue()


async def test_a_cuda_build_that_lists_the_gpus_is_installed_with_its_runtime(
    tmp_path: Path, files: FileServer
) -> None:
    files.publish(
        TAG,
        {
            CUDA_ASSET: _script_archive(tmp_path, L4),
            CUDART_ASSET: _cudart(),
            f"llama-{TAG}-bin-ubuntu-x64.tar.gz": b"never fetched",
        },
    )
    async with httpx2.AsyncClient() as client:
        mgr = EngineManager(tmp_path / "node", client, CUDA_NODE)
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "installed", state.describe()
    assert (Path(state.binary).parent / "libcudart.so.12").read_bytes() == b"\x7fELF"
    assert state.provenance is not None
    assert state.provenance.backend == "cuda"
    assert state.provenance.runtime == f"cudart archive {CUDART_ASSET}"
    assert "cuda build; " in state.provenance.describe()
    # The proof asked for the node's GPUs, in nvidia-smi's (PCI bus) order.
    assert (tmp_path / "list-devices-env").read_text().split() == [
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES=0,1",
    ]
    assert mgr.degraded() == ""


async def test_a_cuda_build_that_sees_fewer_gpus_than_the_node_is_refused(tmp_path: Path, files: FileServer) -> None:
    files.publish(TAG, {CUDA_ASSET: _script_archive(tmp_path, L4.split("\\n")[0] + "\\n")})
    async with httpx2.AsyncClient() as client:
        state = await EngineManager(tmp_path / "node", client, CUDA_NODE).install(
            EngineSpec("llama.cpp", TAG, files.release_api())
        )
    assert state.status == "failed"
    assert "lists 1 CUDA device(s), and the node reported 2 GPU(s)" in state.detail


async def test_a_cuda_plugin_that_cannot_initialise_is_refused_with_the_engines_words(
    tmp_path: Path, files: FileServer
) -> None:
    said = (
        "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime "
        "version\\nload_backend: loaded CPU backend from ./libggml-cpu.so\\n"
    )
    files.publish(TAG, {CUDA_ASSET: _script_archive(tmp_path, "  (none)\\n", said=said)})
    async with httpx2.AsyncClient() as client:
        state = await EngineManager(tmp_path / "node", client, CUDA_NODE).install(
            EngineSpec("llama.cpp", TAG, files.release_api())
        )
    assert state.status == "failed"
    assert "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient" in state.detail
    assert "lists 0 CUDA device(s), and the node reported 2 GPU(s)" in state.detail


async def test_a_vulkan_node_proves_its_build_on_the_gpus_it_reported(tmp_path: Path, files: FileServer) -> None:
    listing = "  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)\\n"
    files.publish(
        TAG,
        {
            f"llama-{TAG}-bin-ubuntu-vulkan-x64.tar.gz": _script_archive(tmp_path, listing),
            CUDA_ASSET: b"never fetched",
            f"llama-{TAG}-bin-ubuntu-x64.tar.gz": b"never fetched",
        },
    )
    async with httpx2.AsyncClient() as client:
        mgr = EngineManager(tmp_path / "node", client, VULKAN_NODE)
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "installed", state.describe()
    assert state.provenance is not None and state.provenance.backend == "vulkan"
    # ggml's own variable: without it ggml-vulkan skips CPU-type devices such as lavapipe.
    assert (tmp_path / "list-devices-env").read_text().split() == ["GGML_VK_VISIBLE_DEVICES=0"]
    assert mgr.device_environment("vulkan", [0]) == {"GGML_VK_VISIBLE_DEVICES": "0"}


async def test_a_gpu_node_offered_only_a_cpu_build_installs_it_and_is_degraded(
    tmp_path: Path, files: FileServer
) -> None:
    files.publish(TAG, {f"llama-{TAG}-bin-ubuntu-x64.tar.gz": _script_archive(tmp_path, "  (none)\\n")})
    async with httpx2.AsyncClient() as client:
        mgr = EngineManager(tmp_path / "node", client, CUDA_NODE)
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "installed", state.describe()
    assert state.provenance is not None and state.provenance.backend == "cpu"
    assert mgr.degraded() == "this node has NVIDIA GPUs but its llama.cpp engine is a CPU build"


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs cc to build a plugin that lacks a library")
async def test_a_backend_plugin_missing_its_runtime_is_refused_naming_the_library(
    tmp_path: Path, files: FileServer
) -> None:
    # llama-server itself never links the CUDA runtime: the plugin does, and ldd on the binary
    # alone said nothing. The plugin is a real ELF needing libcudart.so.12, which is not there.
    plugin = await trio.to_thread.run_sync(_plugin_needing_cudart, tmp_path / "build")
    archive = _script_archive(tmp_path, L4, extra={"libggml-cuda.so": plugin.read_bytes()})
    files.publish(TAG, {CUDA_ASSET: archive})
    async with httpx2.AsyncClient() as client:
        state = await EngineManager(tmp_path / "node", client, CUDA_NODE).install(
            EngineSpec("llama.cpp", TAG, files.release_api())
        )
    assert state.status == "failed"
    assert "missing library: libcudart.so.12" in state.detail


def _plugin_needing_cudart(work: Path) -> Path:
    work.mkdir()
    stub = work / "libcudart.so.12"
    subprocess.run(
        ["cc", "-shared", "-o", str(stub), "-Wl,-soname,libcudart.so.12", "-x", "c", "/dev/null"],
        check=True,
        capture_output=True,
    )
    plugin = work / "libggml-cuda.so"
    subprocess.run(
        ["cc", "-shared", "-o", str(plugin), "-x", "c", "/dev/null", "-x", "none", "-Wl,--no-as-needed", str(stub)],
        check=True,
        capture_output=True,
    )
    stub.unlink()
    return plugin


LOAD_LOG = b"""llama_model_load: loading model
load_tensors: loading model tensors, this can take a while... (mmap = true)
load_tensors: offloading output layer to GPU
load_tensors: offloading 2 repeating layers to GPU
load_tensors: offloaded 3/3 layers to GPU
load_tensors:      Vulkan0 model buffer size =     0.30 MiB
"""


def test_the_load_log_says_how_many_layers_went_to_the_gpu() -> None:
    assert offloaded_layers(LOAD_LOG) == (3, 3)
    assert offload_problem(LOAD_LOG, [0]) == ""
    # A restart appends to the log: the last load is the one that counts.
    assert offloaded_layers(LOAD_LOG + b"load_tensors: offloaded 0/3 layers to GPU\n") == (0, 3)
    assert "offloaded 0/3 layers to GPU: it runs on the CPU" in offload_problem(
        LOAD_LOG + b"load_tensors: offloaded 0/3 layers to GPU\n", [0]
    )
    # A CPU build (or a GPU build whose plugin did not load) logs no offload at all.
    assert "no 'offloaded N/M layers to GPU' line" in offload_problem(b"load_tensors: CPU_Mapped model buffer\n", [1])


@pytest.mark.parametrize(
    ("plat", "backend", "env"),
    [
        (CUDA_NODE, "cuda", {"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
        (
            Platform("linux", "x86_64", rocm=True, gpu_backend="rocm", gpus=(0, 1)),
            "rocm",
            {"HIP_VISIBLE_DEVICES": "1,0"},
        ),
        (
            Platform("linux", "x86_64", vulkan=True, gpu_backend="vulkan", gpus=(0, 1)),
            "vulkan",
            {"GGML_VK_VISIBLE_DEVICES": "1,0"},
        ),
        # A Vulkan build pinned on an NVIDIA node: nvidia-smi's indices are not Vulkan's; nothing is set.
        (CUDA_NODE, "vulkan", {}),
        (CUDA_NODE, "cpu", {}),
    ],
)
def test_each_backend_gets_the_placed_gpus_through_its_own_variable(
    plat: Platform, backend: str, env: dict[str, str]
) -> None:
    mgr = EngineManager(Path("/nonexistent"), httpx2.AsyncClient(), plat)
    assert mgr.device_environment(backend, [1, 0]) == env


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000), st.lists(st.integers(0, 7), min_size=1, max_size=4))
def test_hostile_engine_output_never_breaks_the_parsers(text: str, devices: list[int]) -> None:
    # What an engine prints is its own: any bytes give a list, a count or a reason, never an exception.
    listed = parse_list_devices(text)
    assert all(name and description is not None for name, description in listed)
    layers = offloaded_layers(text.encode(errors="replace"))
    assert layers is None or all(0 <= n < 10**6 for n in layers)
    assert isinstance(offload_problem(text.encode(errors="replace"), devices), str)
    gpus, problem = gpu_probe.parse_vulkan_devices(text, software=True)
    assert isinstance(gpus, list) and isinstance(problem, str)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=20,
    )
)
def test_hostile_vulkan_probe_json_never_breaks_the_probe(data: object) -> None:
    gpus, _ = gpu_probe.parse_vulkan_devices(json.dumps({"devices": data}), software=True)
    assert all(type(g.index) is int and type(g.memory_total_mib) is int for g in gpus)


async def test_the_service_says_a_gpu_node_on_the_cpu_build_is_degraded(
    tmp_path: Path, files: FileServer, caplog: pytest.LogCaptureFixture
) -> None:
    import attrs

    from llmgw_node.config import NodeConfig
    from llmgw_node.service import open_node_service
    from llmgw_shared.facts import GpuFacts, unprobed
    from llmgw_shared.wire import SetEngines

    files.publish(TAG, {f"llama-{TAG}-bin-ubuntu-x64.tar.gz": _script_archive(tmp_path, "  (none)\\n")})
    l4 = GpuFacts(index=0, name="NVIDIA L4", uuid="GPU-0", memory_total_mib=23034, memory_free_mib=22700)
    facts = attrs.evolve(
        unprobed(),
        probed=True,
        arch="x86_64",
        nvidia_driver="550.54.15",
        gpus=[l4],
        gpu_backend="cuda",
        gpu_backends=["cuda"],
    )
    config = NodeConfig(data_dir=str(tmp_path / "node"), node_id="n", token="t")
    async with open_node_service(config, facts=facts) as svc:
        assert svc.facts.degraded == ""
        ack = await svc.handle(
            SetEngines(id="1", fencing_token=1, engines=[EngineSpec("llama.cpp", TAG, files.release_api())])
        )
        assert ack.ok
        await wait_until(lambda: svc.engines.state("llama.cpp", TAG).status == "installed", timeout=30, interval=0.02)
        assert svc.facts.degraded == "this node has NVIDIA GPUs but its llama.cpp engine is a CPU build"
    assert any(
        "degraded: this node has NVIDIA GPUs" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records
    )
