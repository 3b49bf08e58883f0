"""NVIDIA's CUDA runtime wheels, pinned by control and served to nodes (``llmgw-control engines runtime``).

A CUDA build of llama.cpp whose release has no ``cudart-`` archive needs ``libcudart`` and
``libcublas`` from somewhere; nodes take them from NVIDIA's wheels on PyPI, which control serves
so that an air-gapped node needs nothing from outside. As ``release prepare`` pins node wheels to
uv.lock, this pins the runtime wheels to the table below (project, version, file, sha256, size),
downloads each into ``<files_dir>/engines/`` checked against its sha256 (a mismatch is refused and
nothing is left behind), and records what it put there in ``<files_dir>/engines/cuda-runtime.lock``,
which the release index control generates checks every listed wheel against (fleet/files.py).

The table is the reproducible choice: the same command gives the same bytes next year, whatever
PyPI then calls newest. The sha256s and sizes are the ones PyPI's simple index (PEP 691) publishes,
and the CUDA 12 x86-64 pair is the one the node tests unpack (tools/llmgw_dev/cuda_wheels.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import attrs
import httpx2

from llmgw_shared.hashing import file_sha256

from .node_release import LockedWheel, NodeReleaseError, fetch_file

ENGINES_DIR = "engines"
# Not ``<name>-<version>.json``, which is the shape of a signed static index (files.py).
PINS_FILE = "cuda-runtime.lock"
# The pins file is a few lines per wheel; anything bigger is not ours.
MAX_PINS_BYTES = 1 << 20
ARCHS = ("x86_64", "aarch64")


@attrs.frozen
class RuntimeWheel:
    project: str
    version: str
    filename: str
    url: str
    sha256: str
    size: int


_PYPI = "https://files.pythonhosted.org/packages"
# (CUDA major, machine) -> the wheels. CUDA 12: runtime 12.8 (what llama.cpp's 12.8 builds link
# against) and cuBLAS 12.6, the pair the node tests use; any 12.x pair works by minor-version
# compatibility. CUDA 13: runtime 13.4.92 and cuBLAS 13.8.0.4, published together (CUDA 13.4).
PINNED: dict[tuple[int, str], tuple[RuntimeWheel, ...]] = {
    (12, "x86_64"): (
        RuntimeWheel(
            "nvidia-cuda-runtime-cu12",
            "12.8.90",
            "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            f"{_PYPI}/0d/9b/a997b638fcd068ad6e4d53b8551a7d30fe8b404d6f1804abf1df69838932/"
            "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            "adade8dcbd0edf427b7204d480d6066d33902cab2a4707dcfc48a2d0fd44ab90",
            954765,
        ),
        RuntimeWheel(
            "nvidia-cublas-cu12",
            "12.6.4.1",
            "nvidia_cublas_cu12-12.6.4.1-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            f"{_PYPI}/af/eb/ff4b8c503fa1f1796679dce648854d58751982426e4e4b37d6fce49d259c/"
            "nvidia_cublas_cu12-12.6.4.1-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            "08ed2686e9875d01b58e3cb379c6896df8e76c75e0d4a7f7dace3d7b6d9ef8eb",
            393138322,
        ),
    ),
    (12, "aarch64"): (
        RuntimeWheel(
            "nvidia-cuda-runtime-cu12",
            "12.8.90",
            "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
            f"{_PYPI}/7c/75/f865a3b236e4647605ea34cc450900854ba123834a5f1598e160b9530c3a/"
            "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
            "52bf7bbee900262ffefe5e9d5a2a69a30d97e2bc5bb6cc866688caa976966e3d",
            965265,
        ),
        RuntimeWheel(
            "nvidia-cublas-cu12",
            "12.6.4.1",
            "nvidia_cublas_cu12-12.6.4.1-py3-none-manylinux_2_27_aarch64.whl",
            f"{_PYPI}/97/0d/f1f0cadbf69d5b9ef2e4f744c9466cb0a850741d08350736dfdb4aa89569/"
            "nvidia_cublas_cu12-12.6.4.1-py3-none-manylinux_2_27_aarch64.whl",
            "235f728d6e2a409eddf1df58d5b0921cf80cfa9e72b9f2775ccb7b4a87984668",
            390794615,
        ),
    ),
    (13, "x86_64"): (
        RuntimeWheel(
            "nvidia-cuda-runtime",
            "13.4.92",
            "nvidia_cuda_runtime-13.4.92-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            f"{_PYPI}/98/8a/3431271f6344874b8f1ac03f16b3d679c91493f8da63f716160403e6d0a0/"
            "nvidia_cuda_runtime-13.4.92-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            "9641f797da20ce1dd8e779b6e96d08cf9ba564cec8e8225458811ee26423f3a5",
            2494438,
        ),
        RuntimeWheel(
            "nvidia-cublas",
            "13.8.0.4",
            "nvidia_cublas-13.8.0.4-py3-none-manylinux_2_27_x86_64.whl",
            f"{_PYPI}/7a/38/bdd540bf511d2c9b6f9efc71a81c60cb88e295be0b9312b61d19bbed2212/"
            "nvidia_cublas-13.8.0.4-py3-none-manylinux_2_27_x86_64.whl",
            "9f17797dfcc048694461f4e47de17d2e3c25adf172ef723d2db0a07cd8744b89",
            439317144,
        ),
    ),
    (13, "aarch64"): (
        RuntimeWheel(
            "nvidia-cuda-runtime",
            "13.4.92",
            "nvidia_cuda_runtime-13.4.92-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
            f"{_PYPI}/51/3b/2c6e9d88efa7b3585572760bca5e7da83fa9e06098a9386c7b29c81c46b2/"
            "nvidia_cuda_runtime-13.4.92-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
            "bef071788589550ab02846fcbc732a2b88c2b16f2cd8a0f45d98e68e8c5fb0c8",
            2509438,
        ),
        RuntimeWheel(
            "nvidia-cublas",
            "13.8.0.4",
            "nvidia_cublas-13.8.0.4-py3-none-manylinux_2_27_aarch64.whl",
            f"{_PYPI}/c9/9e/0c73b14c14cd32e8b3a028133371f4bf1d9d14b811c515c5fd1201a3c38d/"
            "nvidia_cublas-13.8.0.4-py3-none-manylinux_2_27_aarch64.whl",
            "e22b25be18f8b7d267dbbe2a8ec78e2c69c05762536d299dd0afa2c847115740",
            552729449,
        ),
    ),
}


def fetch_runtime(
    files_dir: Path,
    cuda: int,
    arch: str,
    *,
    wheels_from: str | None = None,
    say: Callable[[str], None] = print,
    pinned: dict[tuple[int, str], tuple[RuntimeWheel, ...]] | None = None,
) -> list[RuntimeWheel]:
    """The pinned wheels for ``cuda`` on ``arch`` into ``<files_dir>/engines/``, checked; the pins recorded.

    ``wheels_from`` is a directory or URL holding the files by name (a mirror); by default each
    comes from its PyPI URL. A file already there with the pinned sha256 is kept (a re-run fetches
    nothing); one with another sha256 is replaced by the pinned bytes, or refused if they cannot be had.
    """
    table = PINNED if pinned is None else pinned
    wheels = table.get((cuda, arch))
    if wheels is None:
        known = ", ".join(f"--cuda {c} --arch {a}" for c, a in sorted(table))
        raise NodeReleaseError(f"no runtime wheels are pinned for CUDA {cuda} on {arch} (pinned: {known})")
    engines = files_dir / ENGINES_DIR
    engines.mkdir(parents=True, exist_ok=True)
    with httpx2.Client() as client:
        for i, wheel in enumerate(wheels, 1):
            dest = engines / wheel.filename
            if dest.is_file() and dest.stat().st_size == wheel.size and file_sha256(dest) == wheel.sha256:
                say(f"[{i}/{len(wheels)}] {wheel.filename}: already there")
                continue
            say(f"[{i}/{len(wheels)}] {wheel.filename} ({wheel.size / 1e6:.0f} MB)")
            fetch_file(
                client,
                LockedWheel(wheel.filename, wheel.url, wheel.sha256, wheel.size, frozenset()),
                wheels_from,
                dest,
                pinned_by="llmgw-control's pin table",
            )
    record_pins(engines, cuda, arch, wheels)
    return list(wheels)


def record_pins(engines: Path, cuda: int, arch: str, wheels: tuple[RuntimeWheel, ...]) -> None:
    """Add ``wheels`` to the pins file (replacing what it said about those files), in one rename."""
    entries = {e["file"]: e for e in read_pins_entries(engines / PINS_FILE)}
    for wheel in wheels:
        entries[wheel.filename] = {
            "file": wheel.filename,
            "project": wheel.project,
            "version": wheel.version,
            "sha256": wheel.sha256,
            "size": wheel.size,
            "cuda": cuda,
            "arch": arch,
        }
    tmp = engines / f".{PINS_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"wheels": sorted(entries.values(), key=lambda e: e["file"])}, indent=2) + "\n")
    os.replace(tmp, engines / PINS_FILE)


def read_pins_entries(path: Path) -> list[dict[str, object]]:
    """The entries of a pins file; [] when there is none. ValueError when it is not one."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_PINS_BYTES + 1)
    except FileNotFoundError:
        return []
    if len(data) > MAX_PINS_BYTES:
        raise ValueError(f"{path} is over {MAX_PINS_BYTES} bytes")
    try:
        parsed = json.loads(data)
    except RecursionError:  # nested past the parser's depth: not ours either
        raise ValueError(f"{path} is nested too deep") from None
    wheels = parsed.get("wheels") if isinstance(parsed, dict) else None
    if not isinstance(wheels, list) or not all(
        isinstance(e, dict) and isinstance(e.get("file"), str) and isinstance(e.get("sha256"), str) for e in wheels
    ):
        raise ValueError(f"{path} is not a runtime wheel pins file")
    return wheels


def read_pins(engines: Path) -> dict[str, str]:
    """file name -> pinned sha256, from ``<engines>/cuda-runtime.lock``."""
    return {str(e["file"]): str(e["sha256"]) for e in read_pins_entries(engines / PINS_FILE)}
