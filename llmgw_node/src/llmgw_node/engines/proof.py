"""Prove an installed engine runs here: ``ldd`` names missing libraries, ``--version`` answers.

Also knows which OS packages provide the libraries engines commonly miss, for nodes whose
config allows installing them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import trio

from llmgw_shared.logs import get_logger

log = get_logger("llmgw.node.engines.proof")


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


def _clean_env() -> dict[str, str]:
    # LD_LIBRARY_PATH would override the engine's $ORIGIN rpath with whatever the daemon's own
    # environment has on it, so the proof and the run must both go without it.
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    env.pop("LD_PRELOAD", None)
    return env


async def missing_libraries(binary: Path, time_limit: float = 30.0) -> list[str]:
    ldd = shutil.which("ldd")
    if ldd is None:
        log.warning("no ldd on this node; skipping the library check")
        return []
    try:
        with trio.fail_after(time_limit):
            result = await trio.run_process([ldd, str(binary)], capture_stdout=True, capture_stderr=True,
                                            check=False, env=_clean_env())
    except trio.TooSlowError:
        raise ProofError(f"ldd {binary.name} did not finish within {time_limit:g} s") from None
    out = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    if result.returncode != 0 and "not a dynamic executable" in out:
        return []
    return parse_ldd(out)


async def engine_version(binary: Path, args: list[str] | None = None, time_limit: float = 20.0) -> str:
    """Run ``binary --version``; return the first line mentioning a version (stdout or stderr)."""
    cmd = [str(binary), *(args if args is not None else ["--version"])]
    try:
        with trio.fail_after(time_limit):
            result = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False,
                                            stdin=subprocess.DEVNULL, env=_clean_env(),
                                            start_new_session=True, deliver_cancel=_kill_group)
    except trio.TooSlowError:
        raise ProofError(f"{binary.name} --version did not finish within {time_limit:g} s") from None
    except OSError as exc:
        raise ProofError(f"{binary.name} could not run: {exc.strerror or exc}") from None
    # llama-server prints its version on stderr; others use stdout. Look at both.
    text = (result.stdout + b"\n" + result.stderr).decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if result.returncode != 0:
        tail = " | ".join(lines[-3:]) if lines else "no output"
        raise ProofError(f"{binary.name} --version exited with {_exit_text(result.returncode)}: {tail}")
    for line in lines:
        if "version" in line.lower():
            return line
    if lines:
        return lines[0]
    raise ProofError(f"{binary.name} --version printed nothing")


async def _kill_group(proc: trio.Process) -> None:
    # Whatever the binary forked must go too, not only the binary (it has its own session).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _exit_text(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"status {code}"


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
    cmd = (["apt-get", "install", "-y", "--no-install-recommends", *packages] if manager == "apt"
           else ["dnf", "install", "-y", *packages])
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log.info("installing OS packages", extra={"packages": packages, "manager": manager})
    try:
        with trio.fail_after(time_limit):
            result = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False,
                                            env=env)
    except trio.TooSlowError:
        what = f"{cmd[0]} install {' '.join(packages)}"
        raise ProofError(f"{what} did not finish within {time_limit:g} s") from None
    if result.returncode != 0:
        last = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise ProofError(f"{cmd[0]} install {' '.join(packages)} failed: {last[0]}")
