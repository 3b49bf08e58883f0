"""The node's GPUs beyond NVIDIA's: AMD (ROCm) and anything a Vulkan driver lists.

- AMD: the kernel's compute driver (``/dev/kfd``) and, per GPU, the amdgpu DRM device in sysfs
  (vendor ``0x1002``, ``mem_info_vram_total``/``mem_info_vram_used``). ``HIP_VISIBLE_DEVICES``
  indexes GPUs in this order (ROCm enumerates KFD nodes in DRM card order).
- Vulkan: the loader (``libvulkan.so.1``) enumerates devices in a child process
  (``llmgw_node.vulkan_devices``). A driver manifest (ICD json) installed with no loader to use
  it is a GPU the node cannot reach: reported, so the node says it is degraded instead of looking
  like a CPU node.

Software devices (Mesa's lavapipe/llvmpipe, Vulkan type "cpu") are not GPUs: they do not count
unless the test-only switch ``LLMGW_TEST_SOFTWARE_GPUS=1`` is set, which is how the system tests
exercise the whole Vulkan path on a machine without a GPU. ``LLMGW_TEST_VULKAN_LOADER`` names
another loader (a missing one simulates a node whose loader was removed).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import attrs
import trio

from llmgw_shared.facts import GpuFacts
from llmgw_shared.logs import get_logger

log = get_logger(__name__)

SOFTWARE_GPUS_SWITCH = "LLMGW_TEST_SOFTWARE_GPUS"
VULKAN_LOADER_SWITCH = "LLMGW_TEST_VULKAN_LOADER"
VULKAN_LOADER = "libvulkan.so.1"
# Where the Vulkan loader looks for driver manifests (the loader's documented search path).
ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
AMD_VENDOR = "0x1002"
# The child prints one JSON line of at most 64 devices; past this it is not our child's output.
MAX_VULKAN_OUTPUT = 64 << 10
# Creating a Vulkan instance loads every installed driver: about 50 ms, a few seconds on a
# cold NFS root; a driver that hangs must not hang the probe.
VULKAN_PROBE_TIMEOUT = 20.0


@attrs.frozen
class VulkanProbe:
    gpus: list[GpuFacts]
    # Why Vulkan is unusable although a driver is installed ("" when usable, or when none is).
    problem: str = ""
    drivers: list[str] = attrs.field(factory=list)


def software_gpus_allowed() -> bool:
    return os.environ.get(SOFTWARE_GPUS_SWITCH) == "1"


def icd_drivers(dirs: tuple[str, ...] = ICD_DIRS) -> list[str]:
    """The Vulkan driver manifests installed (file names), as the loader would find them."""
    named = os.environ.get("VK_DRIVER_FILES") or os.environ.get("VK_ICD_FILENAMES")
    if named:
        return [Path(p).name for p in named.split(os.pathsep) if p and Path(p).is_file()]
    found: list[str] = []
    for folder in dirs:
        try:
            found += sorted(p.name for p in Path(folder).glob("*.json") if p.is_file())
        except OSError:
            continue
    return found


def parse_vulkan_devices(text: str, *, software: bool) -> tuple[list[GpuFacts], str]:
    """(GPUs, problem) from ``vulkan_devices``' JSON; CPU-type devices only with ``software``."""
    try:
        data = json.loads(text)
    except ValueError:
        return [], "the Vulkan device probe printed no JSON"
    if not isinstance(data, dict):
        return [], "the Vulkan device probe printed no JSON object"
    if "error" in data:
        return [], str(data["error"])[:500]
    gpus: list[GpuFacts] = []
    for dev in data.get("devices", []) if isinstance(data.get("devices"), list) else []:
        if not isinstance(dev, dict):
            continue
        index, name, kind, mib = dev.get("index"), dev.get("name"), dev.get("type"), dev.get("memory_mib")
        # type(), not isinstance(): JSON's true is no index (and control refuses a boolean there).
        if not (type(index) is int and isinstance(name, str) and type(mib) is int) or not 0 <= index < 1024:
            continue
        if kind == "cpu" and not software:
            continue
        gpus.append(
            GpuFacts(
                index=index,
                name=name[:200],
                uuid=f"vulkan-{index}",
                memory_total_mib=max(mib, 0),
                memory_free_mib=max(mib, 0),
            )
        )
    return gpus, ""


async def probe_vulkan(time_limit: float = VULKAN_PROBE_TIMEOUT) -> VulkanProbe:
    drivers = icd_drivers()
    if not drivers:
        return VulkanProbe(gpus=[])
    loader = os.environ.get(VULKAN_LOADER_SWITCH) or VULKAN_LOADER
    try:
        with trio.fail_after(time_limit):
            result = await trio.run_process(
                [sys.executable, "-m", "llmgw_node.vulkan_devices", loader],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    except trio.TooSlowError:
        return VulkanProbe([], f"the Vulkan device probe did not answer within {time_limit:g} s", drivers)
    except OSError as exc:
        return VulkanProbe([], f"the Vulkan device probe could not run: {exc.strerror or exc}", drivers)
    text = result.stdout[:MAX_VULKAN_OUTPUT].decode(errors="replace")
    gpus, problem = parse_vulkan_devices(text, software=software_gpus_allowed())
    if result.returncode != 0 and not problem:
        problem = f"the Vulkan device probe exited with status {result.returncode}"
    if "no Vulkan loader" in problem:
        problem = (
            f"Vulkan driver(s) {', '.join(drivers)} are installed but the Vulkan loader ({loader}) is "
            "not: install it (Debian/Ubuntu: libvulkan1; Fedora: vulkan-loader)"
        )
    elif problem:
        problem = f"Vulkan driver(s) {', '.join(drivers)} installed, but no device could be listed: {problem}"
    return VulkanProbe(gpus=gpus, problem=problem, drivers=drivers)


def lists_a_gpu(drivers: list[str], dev_root: str = "/dev") -> bool:
    """Whether a GPU is there for the installed Vulkan drivers to drive, with no loader to ask.

    Distributions install every Mesa driver manifest together (intel, radeon, lavapipe), so a
    manifest says nothing about hardware: a DRM render node (``/dev/dri/renderD*``) does. With
    the test switch, Mesa's software driver counts as one.
    """
    if software_gpus_allowed() and any(name.startswith("lvp_icd") for name in drivers):
        return True
    return bool(drivers) and any(Path(dev_root, "dri").glob("renderD*"))


NVIDIA_VENDOR = "0x10de"


def nvidia_on_pci(sys_root: str = "/sys") -> bool:
    """An NVIDIA display or 3D controller on the PCI bus (class 0x03xxxx), whatever the driver says:
    the evidence that a node whose nvidia-smi fails (or is missing) has a GPU it cannot reach."""
    for device in Path(sys_root, "bus", "pci", "devices").glob("*"):
        if _read(device / "vendor") == NVIDIA_VENDOR and _read(device / "class").startswith("0x03"):
            return True
    return False


def probe_amd(dev_root: str = "/dev", sys_root: str = "/sys") -> list[GpuFacts]:
    """AMD GPUs the ROCm runtime can use: ``/dev/kfd`` and each amdgpu DRM card with its VRAM."""
    if not Path(dev_root, "kfd").exists():
        return []
    gpus: list[GpuFacts] = []
    cards = sorted(Path(sys_root, "class", "drm").glob("card[0-9]*"), key=lambda p: _card_number(p.name))
    for card in cards:
        device = card / "device"
        if "-" in card.name or _read(device / "vendor") != AMD_VENDOR:
            continue  # connectors (card0-DP-1) and other vendors' cards
        total = _int(_read(device / "mem_info_vram_total")) >> 20
        used = _int(_read(device / "mem_info_vram_used")) >> 20
        name = _read(device / "product_name") or f"AMD GPU {_read(device / 'device') or '?'}"
        unique = _read(device / "unique_id")
        gpus.append(
            GpuFacts(
                index=len(gpus),
                name=name[:200],
                uuid=f"amd-{unique or card.name}"[:100],
                memory_total_mib=total,
                memory_free_mib=max(total - used, 0),
            )
        )
    return gpus


def _card_number(name: str) -> int:
    digits = name.removeprefix("card").split("-", 1)[0]
    return int(digits) if digits.isdigit() else 1 << 30


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()[:200]
    except OSError:
        return ""


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0
