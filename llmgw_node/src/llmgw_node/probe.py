"""Host facts: OS, kernel, CPU and its vector extensions, RAM, disk, GPUs (NVIDIA, AMD, Vulkan).

Parsing is separated from reading so that recorded ``/proc/cpuinfo`` samples and a fake
``nvidia-smi`` exercise the same code the daemon runs.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import time
from pathlib import Path

import attrs
import trio

from llmgw_node import gpu_probe
from llmgw_shared.facts import GpuFacts, HostFacts
from llmgw_shared.logs import get_logger
from llmgw_shared.threads import PROC

log = get_logger(__name__)

NO_AVX2_WARNING = "this CPU has no AVX2: engines run about five times slower; a VM CPU type is the usual cause"
# The extensions engines are built for; the full flag list is noise for placement.
_X86_FEATURES = ("avx", "avx2", "avx512f", "fma", "f16c")
_ARM_FEATURES = ("neon", "asimd", "sve")
NVIDIA_QUERY = "index,name,uuid,memory.total,memory.free,driver_version"


def normalise_arch(machine: str) -> str:
    machine = machine.lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def parse_os_release(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            values[key] = value.strip().strip('"').strip("'")
    return values


def parse_cpuinfo(text: str, arch: str) -> tuple[str, int, list[str]]:
    """Return (model name, logical cores, engine-relevant features) from /proc/cpuinfo text."""
    model = ""
    cores = 0
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        value = value.strip()
        if key == "processor":
            cores += 1
        elif key in ("model name", "hardware", "cpu model") and not model:
            model = value
        elif key in ("flags", "features"):
            flags.update(value.split())
    if arch == "aarch64":
        features = [f for f in _ARM_FEATURES if f in flags]
        # The kernel calls NEON "asimd" on arm64; say both so placement can ask for "neon".
        if "asimd" in flags and "neon" not in features:
            features.insert(0, "neon")
    else:
        features = [f for f in _X86_FEATURES if f in flags]
    return model, cores, features


def parse_meminfo(text: str) -> tuple[int, int]:
    """(total, available) in MiB."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0])
    total = values.get("MemTotal", 0) // 1024
    available = values.get("MemAvailable", values.get("MemFree", 0)) // 1024
    return total, available


def parse_nvidia_smi(text: str) -> tuple[str | None, list[GpuFacts]]:
    """Parse ``nvidia-smi --query-gpu=<NVIDIA_QUERY> --format=csv,noheader,nounits`` output."""
    gpus: list[GpuFacts] = []
    driver: str | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 6:
            raise ValueError(f"nvidia-smi line has {len(fields)} fields, expected 6: {line!r}")
        index, name, uuid, total, free, drv = fields
        driver = drv
        gpus.append(
            GpuFacts(index=int(index), name=name, uuid=uuid, memory_total_mib=_mib(total), memory_free_mib=_mib(free))
        )
    return driver, gpus


def _mib(text: str) -> int:
    # "[N/A]" appears for memory on some MIG and vGPU setups: report 0 rather than fail the probe.
    try:
        return int(float(text))
    except ValueError:
        return 0


def warnings_for(arch: str, features: list[str]) -> list[str]:
    if arch == "x86_64" and "avx2" not in features:
        return [NO_AVX2_WARNING]
    return []


async def probe_nvidia(time_limit: float = 10.0) -> tuple[str | None, list[GpuFacts], str]:
    """(driver, gpus, problem). No ``nvidia-smi`` or no driver loaded means no GPUs, not an error."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, [], ""
    try:
        with trio.fail_after(time_limit):
            result = await trio.run_process(
                [exe, f"--query-gpu={NVIDIA_QUERY}", "--format=csv,noheader,nounits"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    except trio.TooSlowError:
        return None, [], f"nvidia-smi did not answer within {time_limit:.0f} s"
    except OSError as exc:
        return None, [], f"nvidia-smi could not run: {exc.strerror}"
    if result.returncode != 0:
        # Installed tools without a loaded driver: say so in the facts' warnings, report no GPUs.
        first = (result.stderr or result.stdout).decode(errors="replace").strip().splitlines()
        return None, [], f"nvidia-smi failed: {first[0] if first else f'exit {result.returncode}'}"
    try:
        driver, gpus = parse_nvidia_smi(result.stdout.decode(errors="replace"))
    except ValueError as exc:
        return None, [], f"nvidia-smi output not understood: {exc}"
    return driver, gpus, ""


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


async def probe(data_dir: str | Path, *, proc_root: str = "/proc", os_release: str = "/etc/os-release") -> HostFacts:
    """Look at this host now."""
    arch = normalise_arch(platform.machine())
    model, cores, features = parse_cpuinfo(_read(f"{proc_root}/cpuinfo"), arch)
    total, available = parse_meminfo(_read(f"{proc_root}/meminfo"))
    osr = parse_os_release(_read(os_release))
    data = Path(data_dir)
    disk_free = 0
    # The data dir may not exist yet on a fresh node: measure the nearest existing parent.
    for candidate in (data, *data.parents):
        if candidate.exists():
            disk_free = shutil.disk_usage(candidate).free // (1 << 20)
            break
    driver, gpus, gpu_problem = await probe_nvidia()
    warnings = warnings_for(arch, features)
    if gpu_problem:
        warnings.append(gpu_problem)
    backends, gpu_backend, unusable = [], "", ""
    if gpus:
        backends.append("cuda")
        gpu_backend = "cuda"
    amd = await PROC.run(gpu_probe.probe_amd, abandon=True)
    if amd:
        backends.append("rocm")
        if not gpus:
            gpus, gpu_backend = amd, "rocm"
    vulkan = await gpu_probe.probe_vulkan()
    if vulkan.gpus:
        backends.append("vulkan")
        if not gpus:
            gpus, gpu_backend = vulkan.gpus, "vulkan"
    elif vulkan.problem and gpu_probe.lists_a_gpu(vulkan.drivers):
        warnings.append(vulkan.problem)
        if not gpus:
            unusable = vulkan.problem
    if not gpus and not unusable and await PROC.run(gpu_probe.nvidia_on_pci, abandon=True):
        # NVIDIA hardware that nothing reaches: a driver that is not loaded (or no nvidia-smi).
        unusable = f"an NVIDIA GPU is on the PCI bus but {gpu_problem or 'there is no nvidia-smi (no NVIDIA driver)'}"
    return HostFacts(
        probed=True,
        probed_at=time.time(),
        hostname=socket.gethostname(),
        os_id=osr.get("ID", platform.system().lower()),
        os_name=osr.get("NAME", platform.system()),
        os_version=osr.get("VERSION_ID", ""),
        kernel=platform.release(),
        arch=arch,
        cpu_model=model,
        cores=cores or (os.cpu_count() or 0),
        cpu_features=features,
        ram_total_mib=total,
        ram_available_mib=available,
        data_dir=str(data),
        disk_free_mib=disk_free,
        nvidia_driver=driver,
        gpus=gpus,
        warnings=warnings,
        gpu_backend=gpu_backend,
        gpu_backends=backends,
        gpus_unusable=unusable,
    )


def with_time_cleared(facts: HostFacts) -> HostFacts:
    """Facts minus what changes on every probe, to tell whether anything worth sending changed."""
    return attrs.evolve(
        facts, probed_at=0.0, ram_available_mib=facts.ram_available_mib // 256, disk_free_mib=facts.disk_free_mib // 256
    )
