"""Which build each device mix gets, over the asset list of the pinned tag (samples/release-b11312-assets.txt).

Every row is one node: its CPU, its GPUs (NVIDIA with a driver version, AMD, Vulkan), an optional
pin from the node's config, and the archives it must install (or the refusal it must get).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_node.engines.backends import backend_of, cuda_version, driver_major
from llmgw_node.engines.release import Platform, ReleaseError, choose_build, parse_release

SAMPLE = Path(__file__).parent / "samples" / "release-b11312-assets.txt"
NAMES = [line.strip() for line in SAMPLE.read_text().splitlines() if line.strip() and not line.startswith("#")]
RELEASE = {
    "tag_name": "b11312",
    "assets": [
        {"name": n, "size": 10, "browser_download_url": f"https://example.invalid/{n}", "digest": f"sha256:{'a' * 64}"}
        for n in NAMES
    ],
}
X64 = {"os": "linux", "arch": "x86_64"}
CUDA13 = ["llama-b11312-bin-ubuntu-cuda-13.4-x64.tar.gz", "cudart-llama-b11312-bin-ubuntu-cuda-13.4-x64.tar.gz"]
CUDA12 = ["llama-b11312-bin-ubuntu-cuda-12.8-x64.tar.gz", "cudart-llama-b11312-bin-ubuntu-cuda-12.8-x64.tar.gz"]
CPU = ["llama-b11312-bin-ubuntu-x64.tar.gz"]
VULKAN = ["llama-b11312-bin-ubuntu-vulkan-x64.tar.gz"]
ROCM = ["llama-b11312-bin-ubuntu-rocm-7.2-x64.tar.gz"]

ROWS = [
    # (what the node is, Platform, archives, backend, degraded)
    ("CPU only", Platform(**X64), CPU, "cpu", False),
    ("arm64 CPU only", Platform("linux", "aarch64"), ["llama-b11312-bin-ubuntu-arm64.tar.gz"], "cpu", False),
    ("H100, driver 580", Platform(**X64, cuda=True, nvidia_driver="580.65.06"), CUDA13, "cuda", False),
    ("H100, driver 590", Platform(**X64, cuda=True, nvidia_driver="590.44.01"), CUDA13, "cuda", False),
    # The case the issue found: driver 550 (CUDA 12.4) was given the 13.4 build.
    ("L4, driver 550", Platform(**X64, cuda=True, nvidia_driver="550.54.15"), CUDA12, "cuda", False),
    ("A100, driver 525", Platform(**X64, cuda=True, nvidia_driver="525.147.05"), CUDA12, "cuda", False),
    ("NVIDIA, driver version unknown", Platform(**X64, cuda=True), CUDA13, "cuda", False),
    # NVIDIA's driver ships a Vulkan ICD too: CUDA still comes first.
    ("NVIDIA with Vulkan too", Platform(**X64, cuda=True, nvidia_driver="570.1", vulkan=True), CUDA12, "cuda", False),
    ("AMD MI300 (/dev/kfd)", Platform(**X64, rocm=True), ROCM, "rocm", False),
    ("AMD with Vulkan too", Platform(**X64, rocm=True, vulkan=True), ROCM, "rocm", False),
    ("Intel Arc (Vulkan only)", Platform(**X64, vulkan=True), VULKAN, "vulkan", False),
    (
        "arm64 with Vulkan",
        Platform("linux", "aarch64", vulkan=True),
        ["llama-b11312-bin-ubuntu-vulkan-arm64.tar.gz"],
        "vulkan",
        False,
    ),
    # arm64 has no CUDA build upstream: the node with a Jetson-like GPU runs on the CPU, degraded.
    (
        "arm64 with NVIDIA",
        Platform("linux", "aarch64", cuda=True, nvidia_driver="580.1"),
        ["llama-b11312-bin-ubuntu-arm64.tar.gz"],
        "cpu",
        True,
    ),
    ("arm64 with AMD", Platform("linux", "aarch64", rocm=True), ["llama-b11312-bin-ubuntu-arm64.tar.gz"], "cpu", True),
    (
        "NVIDIA pinned to vulkan",
        Platform(**X64, cuda=True, nvidia_driver="580.1", vulkan=True, backend="vulkan"),
        VULKAN,
        "vulkan",
        False,
    ),
    ("NVIDIA pinned to cpu", Platform(**X64, cuda=True, nvidia_driver="580.1", backend="cpu"), CPU, "cpu", True),
    ("CPU node pinned to cpu", Platform(**X64, backend="cpu"), CPU, "cpu", False),
]


@pytest.mark.parametrize(("node", "plat", "archives", "backend", "degraded"), ROWS, ids=[r[0] for r in ROWS])
def test_each_device_mix_gets_its_build(
    node: str, plat: Platform, archives: list[str], backend: str, degraded: bool
) -> None:
    choice = choose_build(parse_release(RELEASE), plat)
    assert [a.name for a in choice.assets] == archives
    assert choice.backend == backend
    assert bool(choice.degraded) == degraded
    if degraded:
        assert "GPUs" in choice.degraded


def test_a_driver_too_old_for_every_cuda_build_is_refused_naming_the_driver_needed() -> None:
    with pytest.raises(ReleaseError) as info:
        choose_build(parse_release(RELEASE), Platform(**X64, cuda=True, nvidia_driver="470.256.02"))
    text = str(info.value)
    assert "NVIDIA driver 470.256.02 is too old for every CUDA build" in text
    assert "NVIDIA driver 525 or later is needed" in text
    assert "CUDA 13.4 needs NVIDIA driver 580 or later" in text
    assert "engine_backend" in text


def test_a_driver_for_cuda_12_only_never_gets_the_13_build_even_when_it_is_the_only_one() -> None:
    only13 = {"assets": [a for a in RELEASE["assets"] if "12.8" not in str(a["name"])]}  # type: ignore[attr-defined]
    with pytest.raises(ReleaseError, match="NVIDIA driver 580 or later is needed"):
        choose_build(parse_release(only13), Platform(**X64, cuda=True, nvidia_driver="550.54.15"))


def test_the_first_linux_cuda_tags_had_no_runtime_archive() -> None:
    no_cudart = {"assets": [a for a in RELEASE["assets"] if not str(a["name"]).startswith("cudart-")]}  # type: ignore[attr-defined]
    choice = choose_build(parse_release(no_cudart), Platform(**X64, cuda=True, nvidia_driver="580.1"))
    assert [a.name for a in choice.assets] == CUDA13[:1]


def test_a_gpu_node_offered_only_the_cpu_build_is_degraded_and_says_why() -> None:
    cpu_only = {"assets": [a for a in RELEASE["assets"] if a["name"] == CPU[0]]}  # type: ignore[attr-defined]
    choice = choose_build(parse_release(cpu_only), Platform(**X64, cuda=True, nvidia_driver="580.1"))
    assert choice.backend == "cpu"
    assert choice.degraded == (
        "this node has NVIDIA GPUs but the release has no build for them that fits linux/x86_64: running on the CPU"
    )


def test_a_pin_the_release_cannot_meet_lists_why_each_asset_does_not_fit() -> None:
    with pytest.raises(ReleaseError) as info:
        choose_build(parse_release(RELEASE), Platform(**X64, backend="rocm"))
    text = str(info.value)
    assert "pinned to rocm" in text
    assert "a ROCm build and this node has no AMD GPU (/dev/kfd)" in text
    assert "llama-b11312-bin-ubuntu-vulkan-x64.tar.gz (a vulkan build, and this node is pinned to rocm" in text


@pytest.mark.parametrize(
    ("variant", "backend", "version"),
    [
        ("", "cpu", None),
        ("cpu", "cpu", None),
        ("cuda-12.8", "cuda", (12, 8)),
        ("cuda-13.4", "cuda", (13, 4)),
        ("cuda-cu12.2.0", "cuda", (12, 2)),
        ("rocm-7.0", "rocm", None),
        ("hip-radeon", "rocm", None),
        ("vulkan", "vulkan", None),
        ("sycl", None, None),
        ("opencl-adreno", None, None),
        ("310p-openEuler", None, None),
    ],
)
def test_variant_names(variant: str, backend: str | None, version: tuple[int, int] | None) -> None:
    assert backend_of(variant) == backend
    assert cuda_version(variant) == version


@pytest.mark.parametrize(
    ("text", "major"), [("550.54.15", 550), ("580.65.06", 580), ("", None), ("N/A", None), ("99999999", None)]
)
def test_driver_major(text: str, major: int | None) -> None:
    assert driver_major(text) == major


def _wheel(name: str) -> dict[str, object]:
    return {
        "name": name,
        "size": 10,
        "browser_download_url": f"https://example.invalid/{name}",
        "digest": f"sha256:{'b' * 64}",
    }


WHEELS = [
    "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl",
    "nvidia_cublas_cu12-12.6.4.1-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "nvidia_cublas_cu12-12.6.4.1-py3-none-manylinux2014_aarch64.whl",
    "nvidia_cuda_runtime-13.4.92-py3-none-manylinux_2_27_x86_64.whl",
    "nvidia_cublas-13.10.0.20-py3-none-manylinux_2_27_x86_64.whl",
    "nvidia_cuda_runtime_cu12-12.8.90-py3-none-win_amd64.whl",
]


@pytest.mark.parametrize(
    ("driver", "runtime"),
    [
        ("550.54.15", [WHEELS[0], WHEELS[2]]),  # CUDA 12.8 build: the newest 12.x of each, for x86-64 Linux
        ("580.65.06", [WHEELS[4], WHEELS[5]]),  # CUDA 13.4 build: the unsuffixed 13.x wheels
    ],
)
def test_without_a_cudart_archive_the_runtime_comes_from_the_wheels_the_index_lists(
    driver: str, runtime: list[str]
) -> None:
    index = {
        "assets": [a for a in RELEASE["assets"] if not str(a["name"]).startswith("cudart-")]  # type: ignore[attr-defined]
        + [_wheel(n) for n in WHEELS]
    }
    choice = choose_build(parse_release(index), Platform(**X64, cuda=True, nvidia_driver=driver))
    assert [a.name for a in choice.assets][1:] == runtime


def test_a_cudart_archive_wins_over_wheels_and_half_a_runtime_is_none() -> None:
    index = {"assets": [*RELEASE["assets"], *(_wheel(n) for n in WHEELS)]}  # type: ignore[misc]
    choice = choose_build(parse_release(index), Platform(**X64, cuda=True, nvidia_driver="580.1"))
    assert [a.name for a in choice.assets] == CUDA13
    no_cublas = {
        "assets": [a for a in RELEASE["assets"] if not str(a["name"]).startswith("cudart-")]  # type: ignore[attr-defined]
        + [_wheel(WHEELS[0])]
    }
    choice = choose_build(parse_release(no_cublas), Platform(**X64, cuda=True, nvidia_driver="550.1"))
    assert [a.name for a in choice.assets] == CUDA12[:1]
