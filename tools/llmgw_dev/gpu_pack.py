"""What ``dev.py gpu-check`` needs on a GPU machine without network, packed beside the checkout.

``python3 dev.py gpu-check --pack`` (where PyPI is reachable) writes ``.gpu-check/`` (ignored by
git; about 60 MB, under the 64 MiB a checkout may carry to such a machine):
- ``wheels/``: every wheel the daemons need at run time (``uv export`` of the lock, no dev tools),
  plus cmake and ninja (to build the engine), for this Python version and Linux x86-64, and
  ``requirements.txt`` naming them;
- ``llama.cpp-src.tar.gz``: the llama.cpp tree from the pinned PyPI sdist without what a
  ``llama-server`` build never reads (vocab models, docs, tests, examples): about 10 MB of 76;
- ``tiny.gguf``: the tiny model (numpy and gguf, which write it, are dev tools).

On the GPU machine, ``dev.py gpu-check`` finds no ``.venv``, makes one from the wheels with no
index (``pip --no-index``), puts the project's sources on its path (a ``.pth`` file), and points
the engine build at the packed sources (``LLMGW_LLAMA_SOURCES``) and the model
(``LLMGW_TINY_MODEL``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

if not __package__:  # run as a script: make the llmgw_dev package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llmgw_dev import build_engine

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / ".gpu-check"
SOURCES = "llama.cpp-src.tar.gz"
# What a llama-server build reads of the llama.cpp tree (LLAMA_BUILD_TESTS/EXAMPLES are off).
KEEP = (
    "CMakeLists.txt",
    "CMakePresets.json",
    "LICENSE",
    "cmake/",
    "common/",
    "ggml/",
    "include/",
    "licenses/",
    "src/",
    "tools/",
    "vendor/",
)
SOURCE_PATHS = ("shared/src", "llmgw_control/src", "llmgw_node/src", "tools")


def say(message: str) -> None:
    print(f"[gpu-pack] {message}", file=sys.stderr, flush=True)


def pack(uv: str, python: str = "") -> Path:
    """Pack for ``python`` ("3.12"; default: this one): the GPU machine's Python, which runs the venv."""
    if PACK.exists():
        shutil.rmtree(PACK)
    (PACK / "wheels").mkdir(parents=True)
    exported = subprocess.run(
        [
            uv,
            "export",
            "--frozen",
            "--no-dev",
            "--no-hashes",
            "--all-packages",
            "--no-emit-workspace",
            "--no-header",
            "--no-annotate",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # cmake and ninja build the engine where no CUDA archive is at hand (a GPU machine may have
    # neither); the lock pins them with the dev tools.
    build_tools = [f"{name}=={_locked_version(name)}" for name in ("cmake", "ninja")]
    requirements = PACK / "requirements.txt"
    requirements.write_text(exported + "".join(f"{line}\n" for line in build_tools))
    version = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    say(f"downloading the run-time wheels for Python {version} on Linux x86-64")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "--platform",
            "linux_x86_64",
            "--python-version",
            version,
            "-r",
            str(requirements),
            "-d",
            str(PACK / "wheels"),
        ],
        check=True,
    )
    say("packing the llama.cpp sources a llama-server build reads")
    prefix = f"llama_cpp_python-{build_engine.SDIST_VERSION}/vendor/llama.cpp/"
    with tarfile.open(build_engine.fetch_sdist()) as src, tarfile.open(PACK / SOURCES, "w:gz") as out:
        for member in src:
            rest = member.name[len(prefix) :] if member.name.startswith(prefix) else None
            if rest and (rest in KEEP or rest.startswith(tuple(k for k in KEEP if k.endswith("/")))):
                out.addfile(member, src.extractfile(member) if member.isfile() else None)
    from llmgw_dev import tiny_model  # numpy and gguf: only where the pack is made

    shutil.copy(tiny_model.ensure_model(), PACK / "tiny.gguf")
    size = sum(p.stat().st_size for p in PACK.rglob("*") if p.is_file())
    say(f"{PACK}: {size / 1e6:.0f} MB")
    return PACK


def _locked_version(name: str) -> str:
    lines = (ROOT / "uv.lock").read_text().splitlines()
    for i, line in enumerate(lines):
        if line == f'name = "{name}"' and lines[i + 1].startswith("version = "):
            return lines[i + 1].split('"')[1]
    raise SystemExit(f"uv.lock pins no {name}")


def offline_environment(venv: Path) -> dict[str, str]:
    """Make ``venv`` from the packed wheels (no network); the variables gpu-check then runs with."""
    if not (venv / "bin" / "python").exists():
        say(f"making {venv} from {PACK / 'wheels'} (no index)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-index",
                "--find-links",
                str(PACK / "wheels"),
                "-r",
                str(PACK / "requirements.txt"),
            ],
            check=True,
        )
        site = next((venv / "lib").glob("python3*/site-packages"))
        (site / "llmgw-sources.pth").write_text("".join(f"{ROOT / p}\n" for p in SOURCE_PATHS))
    return {
        "LLMGW_LLAMA_SOURCES": str(PACK / SOURCES),
        "LLMGW_TINY_MODEL": str(PACK / "tiny.gguf"),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
