"""The dependency tiers the tests run on: the lock, the newest our ranges allow, the lowest they allow.

``uv.lock`` is what developers and CI run by default, but it is not what a user gets: ``pip install``
of our wheels resolves the *newest* versions our ranges allow, and an operator with older packages
around may get the *lowest*. Both are tiers of their own here, so a dependency release that breaks
us fails our CI rather than our users (docs/reliability.md, "Dependency tiers").

A tier other than the lock is built in ``.venv-<tier>``: the ranges of every direct dependency
(the three distributions' ``dependencies`` and the workspace's ``dev`` group), read from the
``pyproject.toml`` files, are resolved by ``uv pip compile --resolution highest|lowest-direct``,
installed exactly (``uv pip sync``), and our three packages are installed editable on top, without
dependencies, so the tests import the working tree. The resolved set is kept in
``.venv-<tier>/resolved.txt`` and its versions of the packages we rely on most are printed.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = ("shared", "llmgw_control", "llmgw_node")
OUR_DISTRIBUTIONS = {"llmgw-shared", "llmgw-control", "llmgw-node"}
TIERS = ("lock", "newest", "lowest")
RESOLUTION = {"newest": "highest", "lowest": "lowest-direct"}
# Printed after a tier is built: the packages whose internals or protocol details we rely on.
WATCHED = (
    "httpx2",
    "httpcore2",
    "h11",
    "hypercorn",
    "quart",
    "quart-trio",
    "trio",
    "trio-websocket",
    "cattrs",
    "attrs",
    "huggingface-hub",
    "psycopg",
    "prometheus-client",
    "openai",
)


def _name(requirement: str) -> str:
    for stop in "[<>=!~; ":
        requirement = requirement.split(stop, 1)[0]
    return requirement.strip().lower().replace("_", "-")


def requirements(root: Path = ROOT) -> list[str]:
    """Every direct requirement of the workspace but our own packages, as the pyproject files say."""
    wanted: list[str] = []
    for member in MEMBERS:
        project = tomllib.loads((root / member / "pyproject.toml").read_text())["project"]
        wanted += project.get("dependencies", [])
    workspace = tomllib.loads((root / "pyproject.toml").read_text())
    wanted += workspace.get("dependency-groups", {}).get("dev", [])
    seen: set[str] = set()
    unique: list[str] = []
    for requirement in wanted:
        if _name(requirement) in OUR_DISTRIBUTIONS or requirement in seen:
            continue
        seen.add(requirement)
        unique.append(requirement)
    return unique


def venv_for(tier: str) -> Path:
    return ROOT / (".venv" if tier == "lock" else f".venv-{tier}")


def build(tier: str, uv: str, say: Callable[[str], None] = print) -> Path:
    """Resolve and install the tier's environment; returns its directory."""
    assert tier in RESOLUTION, tier
    venv = venv_for(tier)
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    wanted = venv / "requirements.in"
    resolved = venv / "resolved.txt"
    wanted.write_text("\n".join(requirements()) + "\n")
    subprocess.run(
        [
            uv,
            "pip",
            "compile",
            "--quiet",
            "--resolution",
            RESOLUTION[tier],
            "--python",
            str(python),
            "--no-header",
            "--upgrade",
            str(wanted),
            "-o",
            str(resolved),
        ],
        check=True,
        cwd=ROOT,
    )
    subprocess.run([uv, "pip", "sync", "--quiet", "--python", str(python), str(resolved)], check=True, cwd=ROOT)
    subprocess.run(
        [
            uv,
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--python",
            str(python),
            *(arg for member in MEMBERS for arg in ("-e", str(ROOT / member))),
        ],
        check=True,
        cwd=ROOT,
    )
    pins = {
        _name(line): line.strip()
        for line in resolved.read_text().splitlines()
        if line and not line.startswith((" ", "#"))
    }
    shown = ", ".join(pins[name] for name in WATCHED if name in pins)
    say(f"dependency tier {tier!r} ({RESOLUTION[tier]}): {shown}")
    return venv
