"""Prove an installed engine runs here: ``ldd`` names missing libraries, ``--version`` answers,
and a GPU build's ``--list-devices`` lists the node's GPUs through its backend.

Also knows which OS packages provide the libraries engines commonly miss, for nodes whose
config allows installing them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import trio

from llmgw_shared.logs import get_logger

log = get_logger(__name__)


class ProofError(Exception):
    """The engine does not run on this node; the text says why."""


# Library -> package, per package manager. Only libraries engine builds are known to need.
KNOWN_PACKAGES: dict[str, dict[str, str]] = {
    "apt": {
        "libgomp.so.1": "libgomp1",
        "libstdc++.so.6": "libstdc++6",
        "libcurl.so.4": "libcurl4",
        "libssl.so.3": "libssl3",
        "libvulkan.so.1": "libvulkan1",
        "libopenblas.so.0": "libopenblas0",
    },
    "dnf": {
        "libgomp.so.1": "libgomp",
        "libstdc++.so.6": "libstdc++",
        "libcurl.so.4": "libcurl",
        "libssl.so.3": "openssl-libs",
        "libvulkan.so.1": "vulkan-loader",
        "libopenblas.so.0": "openblas",
    },
}


def parse_ldd(text: str) -> list[str]:
    """Library names ``ldd`` reports as ``not found``."""
    missing: list[str] = []
    for line in text.splitlines():
        if "=> not found" in line:
            lib = line.split("=>", 1)[0].strip()
            # ldd lists a library once per object that needs it; name each one once.
            if lib not in missing:
                missing.append(lib)
    return missing


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # LD_LIBRARY_PATH would override the engine's $ORIGIN rpath with whatever the daemon's own
    # environment has on it, so the proof and the run must both go without it.
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    env.pop("LD_PRELOAD", None)
    env.update(extra or {})
    return env


# A version line is under 200 bytes and ldd lists a few dozen libraries (about 3 KB): what a
# probe prints past this is dropped (still read, so the probe is not blocked writing it).
MAX_PROBE_OUTPUT = 64 << 10


async def missing_libraries(binary: Path, time_limit: float = 30.0) -> list[str]:
    ldd = shutil.which("ldd")
    if ldd is None:
        log.warning("no ldd on this node; skipping the library check")
        return []
    try:
        # ldd runs the binary's own loader on it (a crafted ELF names its loader): as hostile as
        # --version, and run the same way.
        code, stdout, stderr = await run_probe([ldd, str(binary)], time_limit=time_limit)
    except trio.TooSlowError:
        raise ProofError(f"ldd {binary.name} did not finish within {time_limit:g} s") from None
    except OSError as exc:
        raise ProofError(f"ldd {binary.name} could not run: {exc.strerror or exc}") from None
    out = stdout.decode(errors="replace") + stderr.decode(errors="replace")
    if code != 0 and "not a dynamic executable" in out:
        return []
    return parse_ldd(out)


async def engine_version(binary: Path, args: list[str] | None = None, time_limit: float = 20.0) -> str:
    """Run ``binary --version``; return the first line mentioning a version (stdout or stderr)."""
    cmd = [str(binary), *(args if args is not None else ["--version"])]
    try:
        code, stdout, stderr = await run_probe(cmd, time_limit=time_limit)
    except trio.TooSlowError:
        raise ProofError(f"{binary.name} --version did not finish within {time_limit:g} s") from None
    except OSError as exc:
        raise ProofError(f"{binary.name} could not run: {exc.strerror or exc}") from None
    # llama-server prints its version on stderr; others use stdout. Look at both.
    text = (stdout + b"\n" + stderr).decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if code != 0:
        tail = " | ".join(lines[-3:]) if lines else "no output"
        raise ProofError(f"{binary.name} --version exited with {_exit_text(code)}: {tail}")
    for line in lines:
        if "version" in line.lower():
            return line
    if lines:
        return lines[0]
    raise ProofError(f"{binary.name} --version printed nothing")


async def run_probe(
    cmd: list[str], *, time_limit: float, env: dict[str, str] | None = None
) -> tuple[int, bytes, bytes]:
    """Run ``cmd`` to the end of its output and its exit: (exit code, stdout, stderr).

    It runs in its own session, and when the probe ends -- done, timed out or cancelled -- its
    whole process group is killed: whatever the binary forked dies with the probe, whether or
    not the binary itself exited (a child that keeps stdout open makes the probe time out; one
    that let go of it is killed all the same). The probe is done only when both pipes are closed
    and the binary has exited, within ``time_limit`` (``trio.TooSlowError`` otherwise). A process
    that calls setsid() itself leaves the group and is out of reach (see docs/node.md).
    """
    proc = await trio.lowlevel.open_process(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_clean_env(env),
        start_new_session=True,
    )
    out, err = bytearray(), bytearray()
    try:
        with trio.fail_after(time_limit):
            async with trio.open_nursery() as nursery:
                assert proc.stdout is not None and proc.stderr is not None
                nursery.start_soon(_collect, proc.stdout, out)
                nursery.start_soon(_collect, proc.stderr, err)
            # Both pipes are closed: the binary has exited or is about to.
            await proc.wait()
    finally:
        with trio.CancelScope(shield=True):
            # The group outlives its leader while any member lives, and a live group's id is never
            # handed to a new process: this reaches exactly what the probe started.
            _kill_group(proc.pid)
            with trio.move_on_after(5.0):
                await proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    await trio.aclose_forcefully(stream)
    assert proc.returncode is not None  # reaped above: both pipes closed, then wait() returned
    return proc.returncode, bytes(out), bytes(err)


async def _collect(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
    while chunk := await stream.receive_some(1 << 16):
        if len(into) < MAX_PROBE_OUTPUT:
            into += chunk[: MAX_PROBE_OUTPUT - len(into)]


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# ``  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)`` (common/arg.cpp).
_DEVICE_LINE = re.compile(r"\s+(?P<name>[A-Za-z][A-Za-z_]*)(?P<index>\d+): (?P<description>.*)")
# The engine's own words kept in a refusal: enough lines for "ggml_cuda_init: failed to
# initialize CUDA: ..." and the list, not a whole log.
_REFUSAL_LINES = 8


def parse_list_devices(text: str) -> list[tuple[str, str]]:
    """(device name, description) for each device ``llama-server --list-devices`` prints."""
    devices: list[tuple[str, str]] = []
    listing = False
    for line in text.splitlines():
        if line.startswith("Available devices:"):
            listing = True
            continue
        m = _DEVICE_LINE.fullmatch(line.rstrip()) if listing else None
        if m:
            devices.append((f"{m['name']}{m['index']}", m["description"]))
    return devices


async def listed_devices(
    binary: Path, *, prefix: str, expected: int, env: dict[str, str], time_limit: float = 60.0
) -> list[str]:
    """Run ``--list-devices``; the devices named ``<prefix><i>``, at least ``expected`` of them.

    Otherwise ``ProofError`` with the engine's own words: a GPU build whose backend plugin cannot
    load (no runtime, a driver too old) still starts, on the CPU, and this is where it shows.
    ``env`` restricts the backend to the node's GPUs (CUDA_VISIBLE_DEVICES and its kin).
    """
    try:
        code, stdout, stderr = await run_probe([str(binary), "--list-devices"], time_limit=time_limit, env=env)
    except trio.TooSlowError:
        raise ProofError(f"{binary.name} --list-devices did not finish within {time_limit:g} s") from None
    except OSError as exc:
        raise ProofError(f"{binary.name} could not run: {exc.strerror or exc}") from None
    text = (stdout + b"\n" + stderr).decode(errors="replace")
    found = [name for name, _ in parse_list_devices(text) if name.startswith(prefix) and name[len(prefix) :].isdigit()]
    if code == 0 and len(found) >= expected:
        return found
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = " | ".join(lines[-_REFUSAL_LINES:]) if lines else "no output"
    shown_env = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
    what = (
        f"exited with {_exit_text(code)}"
        if code != 0
        else f"lists {len(found)} {prefix} device(s), and the node reported {expected} GPU(s)"
    )
    raise ProofError(
        f"{binary.name} --list-devices{f' ({shown_env})' if shown_env else ''} {what}; the engine said: {said}"
    )


def _exit_text(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"status {code}"


def can_install_packages() -> bool:
    """apt-get and dnf install only as root; the shipped unit runs the daemon as user llmgw."""
    return os.geteuid() == 0


def install_hint(
    missing: list[str], manager: str | None, known: dict[str, dict[str, str]] | None = None, *, why_not: str = ""
) -> str:
    """Each missing library, the package that provides it, and the command that installs them.

    ``missing library: libgomp.so.1 (package libgomp1); to install: apt-get update && apt-get
    install -y libgomp1, as root (<why_not>)``. Libraries no known package provides are named
    alone: the operator has to find those, and the text does not guess.
    """
    table = (KNOWN_PACKAGES if known is None else known).get(manager or "", {})
    parts = [
        f"missing library: {lib} (package {table[lib]})" if lib in table else f"missing library: {lib}"
        for lib in missing
    ]
    packages, _unknown = packages_for(missing, manager, known) if manager else ([], missing)
    if packages:
        command = (
            f"apt-get update && apt-get install -y {' '.join(packages)}"
            if manager == "apt"
            else f"dnf install -y {' '.join(packages)}"
        )
        parts.append(f"to install: {command}, as root{f' ({why_not})' if why_not else ''}")
    return "; ".join(parts)


async def update_package_index(manager: str, time_limit: float = 300.0) -> None:
    """``apt-get update`` (or ``dnf makecache``): without it a machine whose lists are old or were
    never fetched (a fresh cloud image, a container) cannot find the package at all."""
    cmd = ["apt-get", "update"] if manager == "apt" else ["dnf", "makecache"]
    await _package_command(cmd, " ".join(cmd), time_limit)


def package_manager() -> str | None:
    for name in ("apt-get", "dnf"):
        if shutil.which(name):
            return "apt" if name == "apt-get" else "dnf"
    return None


def packages_for(
    missing: list[str], manager: str, known: dict[str, dict[str, str]] | None = None
) -> tuple[list[str], list[str]]:
    """(packages to install, libraries no known package provides)."""
    table = (KNOWN_PACKAGES if known is None else known).get(manager, {})
    packages = sorted({table[lib] for lib in missing if lib in table})
    unknown = [lib for lib in missing if lib not in table]
    return packages, unknown


async def install_packages(manager: str, packages: list[str], time_limit: float = 600.0) -> None:
    cmd = (
        ["apt-get", "install", "-y", "--no-install-recommends", *packages]
        if manager == "apt"
        else ["dnf", "install", "-y", *packages]
    )
    log.info("installing OS packages", extra={"packages": packages, "manager": manager})
    await _package_command(cmd, f"{cmd[0]} install {' '.join(packages)}", time_limit)


async def _package_command(cmd: list[str], what: str, time_limit: float) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        with trio.fail_after(time_limit):
            result = await trio.run_process(
                cmd, capture_stdout=True, capture_stderr=True, check=False, env=env, stdin=subprocess.DEVNULL
            )
    except trio.TooSlowError:
        raise ProofError(f"{what} did not finish within {time_limit:g} s") from None
    except OSError as exc:
        raise ProofError(f"{what} could not run: {exc.strerror or exc}") from None
    if result.returncode != 0:
        last = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise ProofError(f"{what} failed: {last[0]}")
