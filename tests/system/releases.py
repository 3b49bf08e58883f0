"""Node releases for the tests: the llmgw wheels built from this tree, the lock's dependency wheels
from a local wheelhouse, and ``llmgw-control release prepare`` run as an operator runs it.

The dependency wheels are fetched once per lock (from the lock's own URLs, checked against its
sha256, by the same code ``release prepare`` uses) into the llmgw cache; every test after that is
offline and takes them from a mirror served on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import platform
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
import tomli_w
import trio
from node.release_server import FileServer, run_file_server

from llmgw_control.fleet.agents import token_digest
from llmgw_control.fleet.node_release import WheelTarget, fetch_wheels, plan_release, use
from llmgw_dev.build_engine import cache_dir
from llmgw_dev.engine_proc import free_port
from support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LOCK = ROOT / "uv.lock"
# The Python the install script builds node environments with, and this machine as a target.
NODE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"
HERE = WheelTarget((sys.version_info[0], sys.version_info[1]), platform.machine())
PYTHON_FLAG = f"{HERE.python[0]}.{HERE.python[1]}"
SHARED_TOKEN = "llmgw-join-shared-fleet-token"


def uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    spec = importlib.util.spec_from_file_location("llmgw_dev_script", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.uv_binary())


@pytest.fixture(scope="session")
def node_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llmgw-shared and llmgw-node built from this tree, as ``uv build`` builds them for an operator."""
    out = tmp_path_factory.mktemp("dist")
    for package in ("llmgw-shared", "llmgw-node"):
        subprocess.run(
            [uv(), "build", "--wheel", "--package", package, "--out-dir", str(out), "--quiet"], cwd=ROOT, check=True
        )
    return out


@pytest.fixture(scope="session")
def wheelhouse(node_dist: Path) -> Path:
    """Every dependency wheel of llmgw-node for this machine at the lock's versions (fetched once)."""
    plan = plan_release(LOCK, node_dist, [HERE])
    house = cache_dir() / "wheelhouse" / f"release-{plan.lock_sha256[:16]}-{HERE.name}"
    if not (house / ".complete").exists():
        house.mkdir(parents=True, exist_ok=True)
        missing = [w for w in plan.wheels if not (house / w.filename).exists()]
        fetch_wheels(missing, house, say=lambda _: None)
        (house / ".complete").write_text("")
    return house


@asynccontextmanager
async def wheel_mirror(house: Path) -> AsyncIterator[FileServer]:
    """The wheelhouse served over HTTP on 127.0.0.1 (``--wheels-from <base>/files``)."""
    wheels = _read_wheels(house)
    async with run_file_server() as server:
        for name, data in wheels.items():
            server.add_file(name, data)
        yield server


def _read_wheels(house: Path) -> dict[str, bytes]:
    return {wheel.name: wheel.read_bytes() for wheel in house.glob("*.whl")}


def prepare(files_dir: Path, dist: Path, mirror: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``llmgw-control release prepare`` exactly as the guide says, with this machine as the target."""
    return subprocess.run(
        [
            str(BIN / "llmgw-control"),
            "release",
            "--files-dir",
            str(files_dir),
            "prepare",
            "--lock",
            str(LOCK),
            "--dist",
            str(dist),
            "--python",
            PYTHON_FLAG,
            "--arch",
            HERE.arch,
            "--wheels-from",
            mirror,
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def repacked(dist: Path, out: Path, level: int) -> Path:
    """The same wheels with the node wheel's bytes changed (recompressed): a new release of the
    same code, as a rebuild with a new toolchain would be."""
    out.mkdir(parents=True, exist_ok=True)
    for wheel in dist.glob("*.whl"):
        target = out / wheel.name
        if not wheel.name.startswith("llmgw_node-"):
            shutil.copyfile(wheel, target)
            continue
        with (
            zipfile.ZipFile(wheel) as src,
            zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as dst,
        ):
            for item in src.infolist():
                dst.writestr(item, src.read(item.filename), compress_type=zipfile.ZIP_DEFLATED, compresslevel=level)
    return out


def fake_release(releases: Path, wheels: dict[str, bytes], requirements: str = "attrs==1 --hash=sha256:00\n") -> str:
    """A prepared release written by hand (what ``release prepare`` writes), made current."""
    release_id = "0.1.0-" + hashlib.sha256(requirements.encode()).hexdigest()[:12]
    folder = releases / release_id
    folder.mkdir(parents=True)
    for name, data in wheels.items():
        (folder / name).write_bytes(data)
    (folder / "requirements.txt").write_text(requirements)
    (folder / "release.json").write_text(
        json.dumps(
            {
                "id": release_id,
                "node_version": "0.1.0",
                "targets": ["cp311-x86_64", "cp312-aarch64"],
                "requirements_sha256": hashlib.sha256(requirements.encode()).hexdigest(),
                "files": [
                    {"name": n, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in wheels.items()
                ],
            }
        )
    )
    use(releases, release_id)
    return release_id


@asynccontextmanager
async def running_control(tmp_path: Path, files: Path) -> AsyncIterator[tuple[str, int, Path]]:
    """``llmgw-control run`` serving ``files`` (its node releases) to nodes: (admin URL, agent port, log)."""
    api, admin, agents = free_port(), free_port(), free_port()
    config = tmp_path / "control.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "listen": f"127.0.0.1:{api}",
                "admin_listen": f"127.0.0.1:{admin}",
                "data_dir": str(tmp_path / "control"),
                "shutdown_grace": 1.0,
                "log_format": "json",
                "engines": [],
                # A closed fleet: only the shared token, or a node's own onboarding token for its own id.
                "agents": {
                    "listen": f"127.0.0.1:{agents}",
                    "files_dir": str(files),
                    "join_token_digests": [token_digest(SHARED_TOKEN)],
                    "heartbeat_interval": 0.5,
                    "unreachable_after": 2.0,
                    "lost_after": 4.0,
                },
            }
        )
    )
    control_log = tmp_path / "control.log"
    admin_url = f"http://127.0.0.1:{admin}"
    with open(control_log, "ab") as out:  # noqa: ASYNC230 -- a local file, opened once
        control = await trio.lowlevel.open_process(
            [str(BIN / "llmgw-control"), "run", "--config", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        async with httpx2.AsyncClient(timeout=30) as client:

            async def healthy() -> bool:
                try:
                    return (await client.get(f"{admin_url}/healthz")).status_code == 200
                except httpx2.TransportError:
                    return False

            await wait_until(healthy, timeout=30, interval=0.1)
        yield admin_url, agents, control_log
    finally:
        with trio.CancelScope(shield=True):
            control.send_signal(signal.SIGTERM)
            with trio.move_on_after(10):
                await control.wait()
            if control.returncode is None:
                control.kill()
                await control.wait()
