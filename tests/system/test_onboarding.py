"""Onboarding a node: POST /api/v1/nodes, then its install command, run in a temporary root.

The system test builds the llmgw-shared and llmgw-node wheels with ``uv build`` (as an operator
would), puts them in control's ``<files_dir>/wheels/`` with the dependency wheels (downloaded
once into the llmgw cache, then offline: the command runs with ``PIP_NO_INDEX=1``, as on an
air-gapped cluster), and runs the command exactly as printed. The script installs a venv, writes
the node's config and, with no systemd here, starts the daemon, which must join.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
import tomli_w
import trio

from llmgw_control.fleet.agents import AgentsConfig, AgentService, token_digest
from llmgw_control.fleet.inventory import Inventory
from llmgw_control.fleet.onboarding import TOKEN_PREFIX, Onboarding, OnboardingError, new_join_token, node_unit
from llmgw_control.store import NodeIdentity
from llmgw_dev.build_engine import cache_dir
from llmgw_dev.engine_proc import free_port
from llmgw_dev.served_files import place
from llmgw_node.config import load_config

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SHARED_TOKEN = "llmgw-join-shared-fleet-token"

# ---------------------------------------------------------------------- fast checks


def test_the_example_unit_is_the_one_the_installer_writes() -> None:
    assert (ROOT / "examples" / "systemd" / "llmgw-node.service").read_text() == node_unit()


def test_join_tokens_are_long_random_and_scrubbed_from_logs() -> None:
    tokens = {new_join_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        assert token.startswith(TOKEN_PREFIX)
        # 32 random bytes in URL-safe base64: 43 characters, 256 bits.
        assert len(token) - len(TOKEN_PREFIX) >= 43
    from llmgw_shared.logs import redact

    token = tokens.pop()
    assert token.removeprefix(TOKEN_PREFIX) not in redact(f"install with LLMGW_JOIN_TOKEN={token}")


async def test_a_token_is_bound_to_its_node_id() -> None:
    token = new_join_token()
    now = datetime.now(UTC)
    stored = {"gpu-3": NodeIdentity("gpu-3", token_digest(token), {"zone": "a"}, False, now, None)}

    async def lookup(node_id: str) -> NodeIdentity | None:
        return stored.get(node_id)

    def service(digests: set[str], *, open_fleet: bool = False) -> AgentService:
        return AgentService(Inventory(), config=AgentsConfig(open_fleet=open_fleet), token_digests=digests,
                            engines=list, on_change=lambda: None, stored_identity=lookup)

    closed = service({token_digest(SHARED_TOKEN)})
    assert await closed._token_ok("gpu-3", token)
    assert not await closed._token_ok("gpu-4", token)
    assert await closed._token_ok("gpu-4", SHARED_TOKEN)
    assert not await closed._token_ok("gpu-3", new_join_token())
    # An onboarded id takes its own token only, not the shared one either.
    assert not await closed._token_ok("gpu-3", SHARED_TOKEN)
    # With no shared tokens (what onboarding leaves) only onboarded nodes get in.
    onboarded_only = service(set())
    assert await onboarded_only._token_ok("gpu-3", token)
    assert not await onboarded_only._token_ok("anything", "")
    assert not await onboarded_only._token_ok("anything", token)
    # An open fleet, chosen on purpose, lets unknown nodes in, but an onboarded id only with its own token.
    open_fleet = service(set(), open_fleet=True)
    assert await open_fleet._token_ok("anything", "")
    assert not await open_fleet._token_ok("gpu-3", "")

    async def broken(node_id: str) -> NodeIdentity | None:
        raise OSError("store down")

    failing = AgentService(Inventory(), config=AgentsConfig(), token_digests=set(), engines=list,
                           on_change=lambda: None, stored_identity=broken)
    # When the store cannot say, the hello is refused (the node retries), never waved through.
    assert not await failing._token_ok("gpu-3", token)


async def test_the_script_pins_the_wheels_and_is_valid_shell(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    onboarding = Onboarding(store=None, public_url="http://10.0.0.1:8443",  # type: ignore[arg-type]
                            agent_ws_url="ws://10.0.0.1:8443/agent/v1", wheels_dir=wheels)
    with pytest.raises(OnboardingError, match="uv build"):
        await onboarding.script()
    wheels.mkdir()
    for name in ("llmgw_shared-0.1.0-py3-none-any.whl", "llmgw_node-0.1.0-py3-none-any.whl",
                 "llmgw_node-0.10.0-py3-none-any.whl", "llmgw_node-0.9.0-py3-none-any.whl"):
        (wheels / name).write_bytes(name.encode())
    script = await onboarding.script()
    # The newest build of each, by version (0.10 after 0.9), with its sha256.
    node = "llmgw_node-0.10.0-py3-none-any.whl"
    assert f"NODE_WHEEL={node}" in script
    assert f"NODE_SHA256={hashlib.sha256(node.encode()).hexdigest()}" in script
    assert "[Service]" in script and "@UNIT@" not in script
    path = tmp_path / "install.sh"
    path.write_text(script)
    assert (await trio.run_process(["sh", "-n", str(path)], check=False)).returncode == 0
    assert onboarding.wheel_path("../wheels/" + node) is None
    assert onboarding.wheel_path(node) == wheels / node
    index = await onboarding.index_html()
    assert f'href="{node}#sha256={hashlib.sha256(node.encode()).hexdigest()}"' in index


# ---------------------------------------------------------------------- the system test


def _uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    spec = importlib.util.spec_from_file_location("llmgw_dev_script", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.uv_binary())


@pytest.fixture(scope="session")
def wheels_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """llmgw-shared and llmgw-node built from this tree, with every dependency wheel beside them."""
    out = tmp_path_factory.mktemp("wheels")
    uv = _uv()
    subprocess.run([uv, "build", "--wheel", "--package", "llmgw-shared", "--out-dir", str(out), "--quiet"],
                   cwd=ROOT, check=True)
    subprocess.run([uv, "build", "--wheel", "--package", "llmgw-node", "--out-dir", str(out), "--quiet"],
                   cwd=ROOT, check=True)
    requirements = subprocess.run(
        [uv, "export", "--frozen", "--package", "llmgw-node", "--no-emit-workspace", "--no-hashes", "--no-dev",
         "--no-header", "--no-annotate"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    # The locked dependency set, fetched once per lock into the cache; later runs are offline.
    key = hashlib.sha256(requirements.encode()).hexdigest()[:16]
    house = cache_dir() / "wheelhouse" / key
    if not (house / ".complete").exists():
        house.mkdir(parents=True, exist_ok=True)
        req = house / "requirements.txt"
        req.write_text(requirements)
        python = Path(sys.base_prefix) / "bin" / "python3"
        subprocess.run([str(python), "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                        "--only-binary=:all:", "--no-deps", "-r", str(req), "-d", str(house)], check=True)
        (house / ".complete").write_text("")
    for wheel in house.glob("*.whl"):
        place(wheel, out / wheel.name)  # in the served directory itself: a symlink out of it is refused
    yield out


async def _nodes(admin: str) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(timeout=10) as client:
        nodes: list[dict[str, Any]] = (await client.get(f"{admin}/api/v1/nodes")).json()["nodes"]
        return nodes


@pytest.mark.slow
async def test_the_install_command_installs_a_node_that_joins(tmp_path: Path, wheels_dir: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "wheels").symlink_to(wheels_dir)
    api, admin, agents = free_port(), free_port(), free_port()
    config = tmp_path / "control.toml"
    config.write_text(tomli_w.dumps({
        "listen": f"127.0.0.1:{api}", "admin_listen": f"127.0.0.1:{admin}", "data_dir": str(tmp_path / "control"),
        "shutdown_grace": 1.0, "log_format": "json", "engines": [],
        # A closed fleet: only the shared token, or a node's own onboarding token for its own id.
        "agents": {"listen": f"127.0.0.1:{agents}", "files_dir": str(files),
                   "join_token_digests": [token_digest(SHARED_TOKEN)], "heartbeat_interval": 0.5,
                   "unreachable_after": 2.0, "lost_after": 4.0},
    }))
    control_log = tmp_path / "control.log"
    root = tmp_path / "root"
    admin_url = f"http://127.0.0.1:{admin}"
    with open(control_log, "ab") as out:  # noqa: ASYNC230 -- a local file, opened once
        control = await trio.lowlevel.open_process([str(BIN / "llmgw-control"), "run", "--config", str(config)],
                                                   stdout=out, stderr=subprocess.STDOUT)
    node_pid = None
    try:
        async with httpx2.AsyncClient(timeout=30) as client:
            with trio.fail_after(30):
                while True:
                    try:
                        if (await client.get(f"{admin_url}/healthz")).status_code == 200:
                            break
                    except httpx2.TransportError:
                        pass
                    await trio.sleep(0.1)
            bad = await client.post(f"{admin_url}/api/v1/nodes", json={"name": "no spaces", "labels": {}})
            assert bad.status_code == 400
            assert bad.json()["error"]["field"] == "name"
            answer = await client.post(f"{admin_url}/api/v1/nodes", json={"name": "gpu-3", "labels": {"zone": "a"}})
            assert answer.status_code == 201, answer.text
            created = answer.json()
            again = await client.post(f"{admin_url}/api/v1/nodes", json={"name": "gpu-3"})
            assert again.status_code == 409
            # A lost token is replaced, not recovered: the first one stops working.
            lost = created["join_token"]
            answer = await client.post(f"{admin_url}/api/v1/nodes/gpu-3/token")
            assert answer.status_code == 200, answer.text
            created = answer.json()
            assert created["join_token"] != lost and created["join_token"] in created["install_command"]
            assert (await client.post(f"{admin_url}/api/v1/nodes/nobody/token")).status_code == 404
            document = (await client.get(f"{admin_url}/api/v1/openapi.json")).json()
            assert "post" in document["paths"]["/api/v1/nodes"]
        token = created["join_token"]
        command = created["install_command"]
        assert created["node_id"] == "gpu-3"
        assert token.startswith(TOKEN_PREFIX) and token in command
        # Registered before it ever connected.
        assert any(n["id"] == "gpu-3" for n in await _nodes(admin_url))

        env = {**os.environ, "LLMGW_INSTALL_ROOT": str(root), "PIP_NO_INDEX": "1",
               "LLMGW_PYTHON": str(Path(sys.base_prefix) / "bin" / "python3")}
        env.pop("VIRTUAL_ENV", None)
        result = await trio.run_process(["sh", "-c", command], env=env, capture_stdout=True, capture_stderr=True,
                                        check=False)
        output = (result.stdout + result.stderr).decode(errors="replace")
        assert result.returncode == 0, output
        node_pid = int((root / "var/lib/llmgw-node/llmgw-node.pid").read_text())

        node_config = root / "etc/llmgw/node.toml"
        loaded = load_config(node_config)
        assert loaded.node_id == "gpu-3"
        assert loaded.token == token
        assert loaded.control == [f"ws://127.0.0.1:{agents}/agent/v1"]
        assert stat.S_IMODE(node_config.stat().st_mode) == 0o600
        assert (root / "opt/llmgw-node/bin/llmgw-node").exists()

        with trio.fail_after(60):
            while True:
                nodes = {n["id"]: n for n in await _nodes(admin_url)}
                if nodes.get("gpu-3", {}).get("state") == "ready":
                    break
                await trio.sleep(0.2)
        # The labels given at onboarding are the connected node's labels (placement uses them).
        assert nodes["gpu-3"]["labels"] == {"zone": "a"}

        # The token is shown once and logged nowhere: not by control, not by the node.
        node_log = (root / "var/lib/llmgw-node/llmgw-node.log").read_text()
        secret = token.removeprefix(TOKEN_PREFIX)
        assert secret not in control_log.read_text()
        assert secret not in node_log
        assert secret not in output
        assert lost.removeprefix(TOKEN_PREFIX) not in control_log.read_text()
        assert re.search(r"connected to control", node_log)

        # An upgrade in place: the same script with LLMGW_UPGRADE=1 keeps the config (and the
        # token in it), reinstalls the wheels and replaces the daemon, which joins again.
        before = node_config.read_bytes()
        script = tmp_path / "node.sh"
        async with httpx2.AsyncClient(timeout=30) as client:
            script.write_text((await client.get(f"http://127.0.0.1:{agents}/install/node.sh")).text)
        upgrade_env = {k: v for k, v in env.items() if k not in ("LLMGW_NODE_ID", "LLMGW_JOIN_TOKEN")}
        result = await trio.run_process(["sh", str(script)], env={**upgrade_env, "LLMGW_UPGRADE": "1"},
                                        capture_stdout=True, capture_stderr=True, check=False)
        assert result.returncode == 0, (result.stdout + result.stderr).decode(errors="replace")
        old_pid, node_pid = node_pid, int((root / "var/lib/llmgw-node/llmgw-node.pid").read_text())
        assert node_pid != old_pid
        assert node_config.read_bytes() == before
        with trio.fail_after(60):
            while not (alive(node_pid)
                       and {n["id"]: n for n in await _nodes(admin_url)}.get("gpu-3", {}).get("state") == "ready"
                       and node_log_sessions(root) >= 2):
                await trio.sleep(0.2)
    finally:
        with trio.CancelScope(shield=True):
            if node_pid is not None:
                with_suppress_kill(node_pid)
            control.send_signal(signal.SIGTERM)
            with trio.move_on_after(10):
                await control.wait()
            if control.returncode is None:
                control.kill()
                await control.wait()


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def node_log_sessions(root: Path) -> int:
    return (root / "var/lib/llmgw-node/llmgw-node.log").read_text().count("connected to control")


def with_suppress_kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
