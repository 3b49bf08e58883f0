"""The GPU backends a llama.cpp build can carry, and what each one needs from the node.

One place for the names the node relies on:
- release asset variants (``llama-bN-bin-ubuntu-<variant>-x64.tar.gz``): ``cuda-12.8``,
  ``cuda-13.4`` (older tags: ``cuda-cu12.2.0``), ``rocm-<ver>`` (also ``hip-*``), ``vulkan``; no
  variant (or ``cpu``) is the CPU build. Other variants (``sycl``, ``openvino``, ``opencl-*``,
  ``kleidiai``...) are not used by this node;
- the device names ``llama-server --list-devices`` prints, ``  <Name><i>: <description> (<total>
  MiB, <free> MiB free)`` (common/arg.cpp, ``common_print_available_devices``), where the name is
  the ggml backend's: ``CUDA0``, ``ROCm0``, ``Vulkan0``;
- the variable that restricts each backend to the GPUs placement chose.
"""

from __future__ import annotations

import re
from typing import Literal, TypeAlias

Backend: TypeAlias = Literal["cuda", "rocm", "vulkan", "cpu"]
BACKENDS: tuple[Backend, ...] = ("cuda", "rocm", "vulkan", "cpu")
GPU_BACKENDS: tuple[Backend, ...] = ("cuda", "rocm", "vulkan")

# The ggml backend's device name prefix in --list-devices and the load log.
DEVICE_PREFIX: dict[Backend, str] = {"cuda": "CUDA", "rocm": "ROCm", "vulkan": "Vulkan"}
# Each backend's own CUDA_VISIBLE_DEVICES: the engine sees only these GPUs, renumbered from 0.
VISIBLE_DEVICES_ENV: dict[Backend, str] = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "rocm": "HIP_VISIBLE_DEVICES",
    # ggml-vulkan's own variable (ggml-vulkan.cpp, "Emulate behavior of CUDA_VISIBLE_DEVICES"):
    # indices into vkEnumeratePhysicalDevices' order. Without it ggml uses only discrete and
    # integrated GPUs; with it, whatever device it names, which is how a CPU device such as
    # Mesa's lavapipe can be used at all.
    "vulkan": "GGML_VK_VISIBLE_DEVICES",
}

# The oldest NVIDIA driver (major version) that runs builds of each CUDA major version: CUDA 13
# needs 580; every CUDA 12.x build runs on 525 or later by minor-version compatibility; CUDA 11
# on 450 (NVIDIA's CUDA compatibility guide, "minimum required driver version").
MIN_DRIVER_FOR_CUDA: dict[int, int] = {13: 580, 12: 525, 11: 450}

_CUDA_VARIANT = re.compile(r"cuda-(?:cu)?(\d{1,3})(?:\.(\d{1,3}))?(?:\.\d{1,3})?")
_VERSIONED = re.compile(r"(?:rocm|hip)(?:-[a-z]*)?-?(\d{1,3})?(?:\.(\d{1,3}))?.*")


def backend_of(variant: str) -> Backend | None:
    """The backend a release variant carries; None for variants this node does not use."""
    if variant in ("", "cpu"):
        return "cpu"
    if variant.startswith("cuda"):
        return "cuda"
    if variant.startswith(("rocm", "hip")):
        return "rocm"
    if variant == "vulkan":
        return "vulkan"
    return None


def cuda_version(variant: str) -> tuple[int, int] | None:
    """``cuda-12.8`` -> (12, 8); ``cuda-cu12.2.0`` -> (12, 2); None when it names no version."""
    m = _CUDA_VARIANT.fullmatch(variant)
    if not m:
        return None
    return int(m[1]), int(m[2] or 0)


def variant_version(variant: str) -> tuple[int, int]:
    """A sort key for builds of one backend: the newest toolkit first (ROCm, CUDA), else (0, 0)."""
    cuda = cuda_version(variant)
    if cuda is not None:
        return cuda
    m = _VERSIONED.fullmatch(variant)
    if m and m[1]:
        return int(m[1]), int(m[2] or 0)
    return 0, 0


def driver_major(driver: str) -> int | None:
    """``"550.54.15"`` -> 550; None when it is not a driver version."""
    head = driver.strip().split(".", 1)[0]
    return int(head) if head.isdigit() and len(head) <= 4 else None


def min_driver(cuda: tuple[int, int]) -> int | None:
    """The oldest driver for a CUDA version; None when we do not know that major version."""
    return MIN_DRIVER_FOR_CUDA.get(cuda[0])


def parse_backend(value: str) -> Backend | None:
    """A backend name as an operator writes it ("" for none)."""
    value = value.strip().lower()
    if value == "hip":
        return "rocm"
    for b in BACKENDS:
        if value == b:
            return b
    return None
