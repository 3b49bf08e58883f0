"""The CUDA runtime from NVIDIA's wheels: real wheels from PyPI (cached), unpacked by the node's
installer beside a CUDA build, and ``ldd`` resolving the CUDA plugin's libraries against them.

No GPU is needed: the plugin is a real ELF that needs ``libcudart.so.12`` and ``libcublas.so.12``
with ``RUNPATH $ORIGIN``, as ``libggml-cuda.so`` does; the build's ``--list-devices`` is scripted.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import httpx2
import pytest
import trio
from node.conftest import TAG
from node.release_server import FileServer

from llmgw_dev.cuda_wheels import ensure_wheels
from llmgw_node.engines.manager import EngineManager
from llmgw_node.engines.release import Platform
from llmgw_shared.wire import EngineSpec

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None, reason="needs cc and ldd"),
]

NODE = Platform(os="linux", arch="x86_64", cuda=True, nvidia_driver="550.54.15", gpu_backend="cuda", gpus=(0,))
BUILD = f"llama-{TAG}-bin-ubuntu-cuda-12.8-x64.tar.gz"
SCRIPT = b"""#!/bin/sh
case "$1" in
  --version) echo 'version: 11312 (0c1e57098)' >&2; exit 0 ;;
  --list-devices) printf 'Available devices:\\n  CUDA0: NVIDIA L4 (22491 MiB, 22004 MiB free)\\n'; exit 0 ;;
esac
exit 1
"""


@pytest.fixture(scope="module")
def wheels() -> list[Path]:
    return ensure_wheels()


def _cuda_build(work: Path) -> bytes:
    """A release archive: the scripted server and a real plugin needing the CUDA runtime and cuBLAS."""
    work.mkdir()
    stubs = []
    for soname in ("libcudart.so.12", "libcublas.so.12"):
        stub = work / soname
        subprocess.run(
            ["cc", "-shared", "-o", str(stub), f"-Wl,-soname,{soname}", "-x", "c", "/dev/null"],
            check=True,
            capture_output=True,
        )
        stubs.append(str(stub))
    plugin = work / "libggml-cuda.so"
    subprocess.run(
        [
            "cc",
            "-shared",
            "-o",
            str(plugin),
            "-x",
            "c",
            "/dev/null",
            "-x",
            "none",
            "-Wl,--no-as-needed",
            *stubs,
            "-Wl,-rpath,$ORIGIN",
            "-Wl,--enable-new-dtags",
        ],
        check=True,
        capture_output=True,
    )
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in (("llama-server", SCRIPT), ("libggml-cuda.so", plugin.read_bytes())):
            info = tarfile.TarInfo(f"llama-{TAG}/{name}")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


async def test_the_runtime_wheels_unpack_beside_the_engine_and_ldd_resolves_against_them(
    tmp_path: Path, files: FileServer, wheels: list[Path]
) -> None:
    build = await trio.to_thread.run_sync(_cuda_build, tmp_path / "build")
    # The release has no cudart- archive; the index lists the pinned wheels (and a CUDA 13 one
    # that must not be taken for a 12.8 build).
    assets = {
        BUILD: build,
        **{w.name: w.read_bytes() for w in wheels},
        "nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_27_x86_64.whl": b"not for CUDA 12",
    }
    files.publish(TAG, assets)
    async with httpx2.AsyncClient() as client:
        state = await EngineManager(tmp_path / "node", client, NODE).install(
            EngineSpec("llama.cpp", TAG, files.release_api())
        )
    assert state.status == "installed", state.describe()
    folder = Path(state.binary).parent
    assert state.provenance is not None
    assert state.provenance.runtime == ("wheels nvidia_cuda_runtime_cu12==12.8.90, nvidia_cublas_cu12==12.6.4.1")
    assert {a.name for a in state.provenance.assets} == {BUILD, *(w.name for w in wheels)}
    for lib in ("libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12"):
        assert (folder / lib).is_file()
    assert not (folder.parent / ".llmgw-runtime").exists() and not (folder / "nvidia").exists()
    for elf in ("libggml-cuda.so", "libcublas.so.12"):
        out = await _ldd(folder / elf)
        assert "not found" not in out, out
    out = await _ldd(folder / "libggml-cuda.so")
    assert f"libcudart.so.12 => {folder}/libcudart.so.12" in out
    assert f"libcublas.so.12 => {folder}/libcublas.so.12" in out
    assert f"libcublasLt.so.12 => {folder}/libcublasLt.so.12" in out


async def _ldd(path: Path) -> str:
    result = await trio.run_process(["ldd", str(path)], capture_stdout=True, check=True)
    return result.stdout.decode()


async def test_without_the_wheels_the_plugin_names_the_missing_runtime(tmp_path: Path, files: FileServer) -> None:
    build = await trio.to_thread.run_sync(_cuda_build, tmp_path / "build")
    files.publish(TAG, {BUILD: build})
    async with httpx2.AsyncClient() as client:
        state = await EngineManager(tmp_path / "node", client, NODE).install(
            EngineSpec("llama.cpp", TAG, files.release_api())
        )
    assert state.status == "failed"
    assert "missing library: libcudart.so.12" in state.detail and "missing library: libcublas.so.12" in state.detail
