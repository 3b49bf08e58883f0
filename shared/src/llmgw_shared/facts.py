"""Host facts: what a node is, as the node's probe saw it.

Shared by both daemons: the node fills these in, control reads them for placement. ``probed``
and ``probed_at`` are explicit so that an empty list (no GPUs) always reads as "has none" and
never as "did not look".
"""

from __future__ import annotations

import attrs


@attrs.frozen
class GpuFacts:
    index: int
    name: str
    uuid: str
    memory_total_mib: int
    memory_free_mib: int


@attrs.frozen
class HostFacts:
    probed: bool
    # Unix time of the probe (wall clock: it is compared across machines by people, not code).
    probed_at: float
    hostname: str
    os_id: str
    os_name: str
    os_version: str
    kernel: str
    arch: str
    cpu_model: str
    cores: int
    # Only the vector extensions engines care about (avx, avx2, avx512f, fma, f16c, neon, sve).
    cpu_features: list[str]
    ram_total_mib: int
    ram_available_mib: int
    data_dir: str
    disk_free_mib: int
    nvidia_driver: str | None
    gpus: list[GpuFacts]
    warnings: list[str] = attrs.field(factory=list)
    # What ``gpus`` are reached through: "cuda" (nvidia-smi indices), "rocm" (HIP order) or
    # "vulkan" (the Vulkan loader's order); "" with no GPUs.
    gpu_backend: str = ""
    # Every GPU backend this node's devices can use ("cuda", "rocm", "vulkan"): what its engine
    # build is chosen for.
    gpu_backends: list[str] = attrs.field(factory=list)
    # GPUs seen that no backend can reach here, and why (a Vulkan driver with no loader): "" if none.
    gpus_unusable: str = ""
    # Why this node, which has GPUs, serves on the CPU only ("" when it is not degraded): set by
    # the node once its engine is chosen and proven. GPU profiles are not placed on it.
    degraded: str = ""


def unprobed() -> HostFacts:
    """Facts that say plainly that nothing was probed yet."""
    return HostFacts(
        probed=False,
        probed_at=0.0,
        hostname="",
        os_id="",
        os_name="",
        os_version="",
        kernel="",
        arch="",
        cpu_model="",
        cores=0,
        cpu_features=[],
        ram_total_mib=0,
        ram_available_mib=0,
        data_dir="",
        disk_free_mib=0,
        nvidia_driver=None,
        gpus=[],
    )
