"""What each engine really uses: RSS of its process tree from /proc, GPU memory from nvidia-smi.

An engine runs in its own session (``procs``), so its process tree is every process whose session
id is the engine's pid: whatever it forks is counted, nothing else is. The GPU side is
``nvidia-smi --query-compute-apps``, which lists the memory each process holds on each GPU.

Parsing is separate from reading, and both treat their input as hostile: ``/proc`` entries vanish
while they are read, and ``nvidia-smi`` prints ``[N/A]``, warnings, or anything at all from a
broken driver. A line that is not understood counts for nothing; nothing here raises.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable

import trio

from llmgw_shared.threads import PROC
from llmgw_shared.wire import MAX_MEMORY_MIB

# Per-process GPU memory; the pid ties it to a replica's process tree.
COMPUTE_APPS_QUERY = "pid,used_memory"
# nvidia-smi answers in well under a second; a wedged driver makes it hang for minutes, which
# must cost one missed measurement, not a stuck loop.
NVIDIA_SMI_TIMEOUT_S = 10.0
# Lines of nvidia-smi output read at most: one per process on the GPUs (a busy 8-GPU host has
# tens); anything beyond is not an answer to our query.
_MAX_APP_LINES = 4096
# Bytes of nvidia-smi output kept: 4096 lines of "pid, MiB".
_MAX_OUTPUT_BYTES = 256 << 10


def parse_status_rss_kib(text: str) -> int:
    """``VmRSS`` of a ``/proc/<pid>/status`` text, in KiB (0 when absent: a kernel thread, a zombie)."""
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if sep and key == "VmRSS":
            parts = rest.split()
            if parts and parts[0].isdigit():
                return int(parts[0])
    return 0


def parse_session(stat: str) -> int | None:
    """The session id (field 6) of a ``/proc/<pid>/stat`` text, or None when it is not one."""
    # The command name (field 2) is in parentheses and may contain spaces and parentheses.
    end = stat.rfind(")")
    if end < 0:
        return None
    fields = stat[end + 2 :].split()
    if len(fields) < 4 or not fields[3].lstrip("-").isdigit():
        return None
    return int(fields[3])


def parse_compute_apps(text: str) -> dict[int, int]:
    """MiB of GPU memory per pid from ``--query-compute-apps=pid,used_memory --format=csv,noheader,nounits``.

    A process on several GPUs appears once per GPU: its lines are summed. Lines that are not two
    numbers (``[N/A]`` on some MIG and vGPU setups, warnings) are skipped.
    """
    used: dict[int, int] = {}
    for line in text.splitlines()[:_MAX_APP_LINES]:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2 or not fields[0].isdigit() or not fields[1].isdigit():
            continue
        pid, mib = int(fields[0]), int(fields[1])
        if pid <= 0 or mib > MAX_MEMORY_MIB:
            continue
        used[pid] = min(MAX_MEMORY_MIB, used.get(pid, 0) + mib)
    return used


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read(64 << 10)
    except OSError:
        return ""


def sessions(proc_root: str = "/proc") -> dict[int, list[int]]:
    """Every pid on the host by its session id."""
    by_session: dict[int, list[int]] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return by_session
    for name in names:
        if not name.isdigit():
            continue
        session = parse_session(_read(f"{proc_root}/{name}/stat"))
        if session is not None:
            by_session.setdefault(session, []).append(int(name))
    return by_session


def tree_rss_mib(pids: Iterable[int], proc_root: str = "/proc") -> int:
    """Resident memory of these processes together, in MiB."""
    kib = sum(parse_status_rss_kib(_read(f"{proc_root}/{pid}/status")) for pid in pids)
    return min(MAX_MEMORY_MIB, kib // 1024)


async def gpu_use_by_pid(time_limit: float = NVIDIA_SMI_TIMEOUT_S) -> dict[int, int]:
    """GPU memory per pid now; empty without nvidia-smi, on its failure, or past ``time_limit``."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        with trio.fail_after(time_limit):
            result = await trio.run_process(
                [exe, f"--query-compute-apps={COMPUTE_APPS_QUERY}", "--format=csv,noheader,nounits"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    except (trio.TooSlowError, OSError):
        return {}
    if result.returncode != 0:
        return {}
    return parse_compute_apps(result.stdout[:_MAX_OUTPUT_BYTES].decode(errors="replace"))


async def measure(engine_pids: Iterable[int], proc_root: str = "/proc") -> dict[int, tuple[int, int]]:
    """(RSS MiB, VRAM MiB) of each engine's process tree (its session), by the engine's pid."""
    wanted = [pid for pid in engine_pids if pid > 0]
    if not wanted:
        return {}
    by_session = await PROC.run(sessions, proc_root, abandon=True)
    gpu = await gpu_use_by_pid()
    out: dict[int, tuple[int, int]] = {}
    for pid in wanted:
        tree = by_session.get(pid) or [pid]
        rss = await PROC.run(tree_rss_mib, tree, proc_root, abandon=True)
        out[pid] = (rss, min(MAX_MEMORY_MIB, sum(gpu.get(p, 0) for p in tree)))
    return out
