"""NVIDIA's CUDA runtime wheels from PyPI, pinned, cached: what a node unpacks beside a CUDA build
of llama.cpp when its release has no ``cudart-`` archive.

The tests unpack them through the node's installer and check that ``ldd`` resolves a CUDA
plugin's libraries against them, which needs no GPU. Downloaded once into
``<cache>/cuda-wheels`` (about 390 MB, nearly all of it cuBLAS) and checked by sha256.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a script: make the llmgw_dev package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llmgw_dev import pypi
from llmgw_dev.build_engine import cache_dir, cache_lock, sha256_of

# (project, file, sha256): the CUDA 12 runtime and cuBLAS for x86-64. cuBLAS 12.6 with runtime
# 12.8 is what the package index reachable here offers; any 12.x pair works by minor-version
# compatibility, which is the point of the test.
CUDA12_X64: list[tuple[str, str, str]] = [
    (
        "nvidia-cuda-runtime-cu12",
        "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "adade8dcbd0edf427b7204d480d6066d33902cab2a4707dcfc48a2d0fd44ab90",
    ),
    (
        "nvidia-cublas-cu12",
        "nvidia_cublas_cu12-12.6.4.1-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "08ed2686e9875d01b58e3cb379c6896df8e76c75e0d4a7f7dace3d7b6d9ef8eb",
    ),
]


def ensure_wheels(pins: list[tuple[str, str, str]] | None = None) -> list[Path]:
    """The pinned wheels in the cache, downloading what is missing or does not match its sha256."""
    folder = cache_dir() / "cuda-wheels"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    with cache_lock("cuda-wheels"):
        for project, name, sha256 in pins or CUDA12_X64:
            target = folder / name
            if not (target.exists() and sha256_of(target) == sha256):
                url, _ = pypi.find_file(project, name)
                pypi.download(url, target, expected_sha256=sha256, label=name)
            paths.append(target)
    return paths


if __name__ == "__main__":
    for path in ensure_wheels():
        print(path)
