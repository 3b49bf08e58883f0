"""Onboarding a node: POST /api/v1/nodes, then its install command, run in a scratch root.

The system tests build the llmgw-shared and llmgw-node wheels with ``uv build`` and run
``llmgw-control release prepare`` (as an operator would; dependency wheels from a mirror on
127.0.0.1), then run the install command exactly as printed, with no package index anywhere:
the script installs the release's pinned wheels into a new environment with pip
--require-hashes from control, writes the node's config and starts the daemon, which must join.
Upgrades, a failed upgrade and a rollback go the same way; the systemd path runs in a scratch
root with stand-ins for useradd, systemctl and friends that record what they were asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.utils import canonicalize_name
from system.releases import (
    BIN,
    NODE_PYTHON,
    ROOT,
    SHARED_TOKEN,
    fake_release,
    node_dist,
    prepare,
    repacked,
    running_control,
    wheel_mirror,
    wheelhouse,
)

from llmgw_control.fleet.agents import AgentsConfig, AgentService, token_digest
from llmgw_control.fleet.inventory import Inventory
from llmgw_control.fleet.onboarding import TOKEN_PREFIX, Onboarding, OnboardingError, new_join_token, node_unit
from llmgw_control.store import NodeIdentity
from llmgw_node.config import load_config
from support.waiting import wait_until

__all__ = ["node_dist", "wheelhouse"]  # fixtures, used by name

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
        return AgentService(
            Inventory(),
            config=AgentsConfig(open_fleet=open_fleet),
            token_digests=digests,
            engines=list,
            stored_identity=lookup,
        )

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

    failing = AgentService(
        Inventory(), config=AgentsConfig(), token_digests=set(), engines=list, stored_identity=broken
    )
    # When the store cannot say, the hello is refused (the node retries), never waved through.
    assert not await failing._token_ok("gpu-3", token)


async def test_the_script_carries_the_current_release_and_is_valid_shell(tmp_path: Path) -> None:
    releases = tmp_path / "node-releases"
    onboarding = Onboarding(
        store=None,
        public_url="http://10.0.0.1:8443",  # type: ignore[arg-type]
        agent_ws_url="ws://10.0.0.1:8443/agent/v1",
        releases_dir=releases,
    )
    with pytest.raises(OnboardingError, match="release prepare"):
        await onboarding.script()
    node = "llmgw_node-0.1.0-py3-none-any.whl"
    requirements = f"llmgw-node==0.1.0 --hash=sha256:{hashlib.sha256(node.encode()).hexdigest()}\n"
    release_id = fake_release(releases, {node: node.encode()}, requirements)
    (releases / release_id / "stray.whl").write_bytes(b"not in the manifest")
    script = await onboarding.script()
    # Every digest the install checks is in the script (whose own digest is in the command).
    assert f"RELEASE_ID={release_id}\n" in script and "TARGETS='cp311-x86_64 cp312-aarch64'" in script
    assert requirements in script and "@REQUIREMENTS@" not in script
    assert "[Service]" in script and "@UNIT@" not in script
    path = tmp_path / "install.sh"
    path.write_text(script)
    assert (await trio.run_process(["sh", "-n", str(path)], check=False)).returncode == 0
    # Only what the manifest lists, only from a release id: never a path, never a stray file.
    assert await onboarding.release_file(release_id, node) == releases / release_id / node
    for rid, name in [
        (release_id, "stray.whl"),
        (release_id, "../" + node),
        (release_id, "release.json"),
        ("../" + release_id, node),
        ("current", node),
        ("0.1.0-000000000000", node),
    ]:
        assert await onboarding.release_file(rid, name) is None, (rid, name)
    index = await onboarding.index_html(release_id)
    assert index is not None and f'href="{node}#sha256={hashlib.sha256(node.encode()).hexdigest()}"' in index
    assert "stray" not in index and await onboarding.index_html("../x") is None
    # A release whose requirements were changed after it was prepared is not served.
    tampered = releases / fake_release(releases, {}, "attrs==2 --hash=sha256:11\n")
    (tampered / "requirements.txt").write_text("attrs==2 --hash=sha256:22\n")
    with pytest.raises(OnboardingError, match=r"does not match its release\.json"):
        await onboarding.script()


@pytest.fixture(scope="module")
def hostile_releases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    releases = tmp_path_factory.mktemp("hostile") / "node-releases"
    fake_release(releases, {"llmgw_node-0.1.0-py3-none-any.whl": b"w"})
    (releases.parent / "secret.whl").write_bytes(b"outside")
    return releases


@settings(max_examples=200, deadline=None)
@given(
    release_id=st.one_of(st.text(max_size=80), st.sampled_from(["current", ".", "..", "0.1.0-0123456789ab"])),
    name=st.one_of(st.text(max_size=80), st.sampled_from(["release.json", "requirements.txt", "../secret.whl"])),
)
def test_no_release_id_or_file_name_reaches_a_file_the_release_does_not_list(
    hostile_releases: Path, release_id: str, name: str
) -> None:
    # Every name a node's request can carry: only a listed wheel of a prepared release answers.
    onboarding = Onboarding(
        store=None,
        public_url="http://10.0.0.1:8443",  # type: ignore[arg-type]
        agent_ws_url="ws://10.0.0.1:8443/agent/v1",
        releases_dir=hostile_releases,
    )

    async def ask() -> tuple[Path | None, str | None]:
        return await onboarding.release_file(release_id, name), await onboarding.index_html(release_id)

    found, page = trio.run(ask)
    if found is not None:
        assert found == hostile_releases / release_id / name and name == "llmgw_node-0.1.0-py3-none-any.whl"
    if page is not None:
        assert (hostile_releases / release_id / "release.json").is_file()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_every_line_of_the_node_unit(tmp_path: Path) -> None:
    unit = tmp_path / "llmgw-node.service"
    unit.write_text(node_unit())
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False)
    # The only complaint may be that the daemon is not installed on this machine.
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line and "/opt/llmgw-node/current/bin/llmgw-node is not executable" not in line
    ]
    assert problems == []


# ---------------------------------------------------------------------- the system test


async def _nodes(admin: str) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(timeout=10) as client:
        nodes: list[dict[str, Any]] = (await client.get(f"{admin}/api/v1/nodes")).json()["nodes"]
        return nodes


async def _add_node(admin_url: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    async with httpx2.AsyncClient(timeout=30) as client:
        answer = await client.post(f"{admin_url}/api/v1/nodes", json={"name": name, "labels": labels})
        assert answer.status_code == 201, answer.text
        created: dict[str, Any] = answer.json()
        return created


async def _script(agents: int, path: Path) -> Path:
    async with httpx2.AsyncClient(timeout=30) as client:
        answer = await client.get(f"http://127.0.0.1:{agents}/install/node.sh")
        assert answer.status_code == 200, answer.text
    await trio.Path(path).write_text(answer.text)
    return path


async def _sh(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    with trio.fail_after(300):
        result = await trio.run_process(args, env=env, capture_stdout=True, capture_stderr=True, check=False)
    return result.returncode, (result.stdout + result.stderr).decode(errors="replace")


def _base_env(root: Path) -> dict[str, str]:
    env = {**os.environ, "LLMGW_INSTALL_ROOT": str(root), "LLMGW_PYTHON": str(NODE_PYTHON)}
    env.pop("VIRTUAL_ENV", None)
    return env


async def _prepared(tmp_path: Path, files: Path, dist: Path, house: Path) -> str:
    async with wheel_mirror(house) as mirror:
        done = await trio.to_thread.run_sync(prepare, files, dist, f"{mirror.base}/files")
    assert done.returncode == 0, done.stderr
    return os.readlink(files / "node-releases" / "current")


@pytest.mark.slow
async def test_the_install_command_installs_a_node_that_joins_then_upgrades_and_rolls_back(
    tmp_path: Path, node_dist: Path, wheelhouse: Path
) -> None:
    files = tmp_path / "files"
    first = await _prepared(tmp_path, files, node_dist, wheelhouse)
    root = tmp_path / "root"
    prefix = root / "opt/llmgw-node"
    node_pid = None
    async with running_control(tmp_path, files) as (admin_url, agents, control_log):
        try:
            async with httpx2.AsyncClient(timeout=30) as client:
                bad = await client.post(f"{admin_url}/api/v1/nodes", json={"name": "no spaces", "labels": {}})
                assert bad.status_code == 400
                assert bad.json()["error"]["field"] == "name"
            created = await _add_node(admin_url, "gpu-3", {"zone": "a"})
            async with httpx2.AsyncClient(timeout=30) as client:
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

            # The fleet is closed (running_control): the release's page and wheels are for enrolled
            # nodes only, so the script's pip must send this node's id and token (from a netrc file).
            page = f"http://127.0.0.1:{agents}/install/releases/{first}/"
            async with httpx2.AsyncClient(timeout=30) as client:
                wheel_name = next(n for n in _pinned_files(files, first) if n.startswith("llmgw_node-"))
                for auth in (None, ("gpu-4", token), ("gpu-3", lost), ("gpu-3", SHARED_TOKEN)):
                    for url in (page, page + wheel_name):
                        assert (await client.get(url, auth=auth)).status_code == 401, (url, auth)
                assert (await client.get(page, auth=("gpu-3", token))).status_code == 200
                assert (await client.get(f"http://127.0.0.1:{agents}/install/node.sh")).status_code == 200

            # No PIP_NO_INDEX, no index reachable or needed: the script names its only source.
            env = _base_env(root)
            code, output = await _sh(["sh", "-c", command], env)
            assert code == 0, output
            # The credentials' netrc went with the script's scratch directory.
            assert not [p for p in root.rglob("*netrc*")]
            node_pid = int((root / "var/lib/llmgw-node/llmgw-node.pid").read_text())
            assert os.readlink(prefix / "current") == f"releases/{first}"
            assert not (prefix / "previous").exists()

            node_config = root / "etc/llmgw/node.toml"
            loaded = load_config(node_config)
            assert loaded.node_id == "gpu-3"
            assert loaded.token == token
            assert loaded.control == [f"ws://127.0.0.1:{agents}/agent/v1"]
            assert stat.S_IMODE(node_config.stat().st_mode) == 0o600
            # Exactly the release's distributions, nothing resolved beside them.
            assert await _distributions(prefix / "current") == _pinned(files, first)

            await _until_ready(admin_url, node_pid, root, sessions=1)
            nodes = {n["id"]: n for n in await _nodes(admin_url)}
            # The labels given at onboarding are the connected node's labels (placement uses them).
            assert nodes["gpu-3"]["labels"] == {"zone": "a"}

            # The token is shown once and logged nowhere: not by control, not by the node.
            node_log = (root / "var/lib/llmgw-node/llmgw-node.log").read_text()
            secret = token.removeprefix(TOKEN_PREFIX)
            assert secret not in control_log.read_text()
            assert secret not in node_log
            assert secret not in output
            assert lost.removeprefix(TOKEN_PREFIX) not in control_log.read_text()

            # An upgrade to a new release: same path, a new environment, switched once it passed.
            second = await _prepared(tmp_path, files, repacked(node_dist, tmp_path / "dist2", level=1), wheelhouse)
            assert second != first
            before = node_config.read_bytes()
            # No id or token given: the upgrade fetches with the ones in the node's config.
            upgrade = {k: v for k, v in env.items() if k not in ("LLMGW_NODE_ID", "LLMGW_JOIN_TOKEN")}
            upgrade["LLMGW_UPGRADE"] = "1"
            code, output = await _sh(["sh", str(await _script(agents, tmp_path / "node.sh"))], upgrade)
            assert code == 0, output
            old_pid, node_pid = node_pid, int((root / "var/lib/llmgw-node/llmgw-node.pid").read_text())
            assert node_pid != old_pid
            assert node_config.read_bytes() == before
            assert os.readlink(prefix / "current") == f"releases/{second}"
            assert os.readlink(prefix / "previous") == f"releases/{first}"
            await _until_ready(admin_url, node_pid, root, sessions=2)

            # A failed upgrade leaves the node as it was. First: the token in the node's config is
            # not the node's (control refuses the wheels to it).
            third = await _prepared(tmp_path, files, repacked(node_dist, tmp_path / "dist3", level=9), wheelhouse)
            node_config.write_text(before.decode().replace(token, new_join_token()))
            code, output = await _sh(["sh", str(await _script(agents, tmp_path / "node.sh"))], upgrade)
            node_config.write_bytes(before)
            assert code != 0, output
            assert f"control did not serve release {third} to node gpu-3 (a 401" in output, output
            assert "error: 401" in output and secret not in output, output
            assert os.readlink(prefix / "current") == f"releases/{second}"
            assert int((root / "var/lib/llmgw-node/llmgw-node.pid").read_text()) == node_pid and alive(node_pid)
            # Then: control's copy of a wheel was changed after the release was prepared, so pip's
            # hash check refuses it.
            wheel = next(p for p in (files / "node-releases" / third).iterdir() if p.name.startswith("llmgw_node-"))
            data = wheel.read_bytes()
            wheel.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
            code, output = await _sh(["sh", str(await _script(agents, tmp_path / "node.sh"))], upgrade)
            assert code != 0
            assert "THESE PACKAGES DO NOT MATCH THE HASHES" in output
            assert f"installing release {third} failed; the node is unchanged" in output
            assert os.readlink(prefix / "current") == f"releases/{second}"
            assert int((root / "var/lib/llmgw-node/llmgw-node.pid").read_text()) == node_pid and alive(node_pid)

            # A rollback needs no control: the kept script switches back to the previous release.
            code, output = await _sh(
                ["sh", str(prefix / "install-node.sh")], {**upgrade, "LLMGW_UPGRADE": "", "LLMGW_ROLLBACK": "1"}
            )
            assert code == 0, output
            assert os.readlink(prefix / "current") == f"releases/{first}"
            assert os.readlink(prefix / "previous") == f"releases/{second}"
            old_pid, node_pid = node_pid, int((root / "var/lib/llmgw-node/llmgw-node.pid").read_text())
            assert node_pid != old_pid
            await _until_ready(admin_url, node_pid, root, sessions=3)
            # Releases other than the current and the previous one are gone.
            assert sorted(p.name for p in (prefix / "releases").iterdir()) == sorted([first, second])

            # The fleet's way: control makes an earlier release current again; a node that still
            # has it switches to it without installing anything.
            used = await trio.run_process(
                [str(BIN / "llmgw-control"), "release", "--files-dir", str(files), "use", second], capture_stdout=True
            )
            assert used.stdout.decode() == f"release {second} is current\n"
            code, output = await _sh(["sh", str(await _script(agents, tmp_path / "node.sh"))], upgrade)
            assert code == 0, output
            assert f"release {second} is already installed; checking it" in output
            assert os.readlink(prefix / "current") == f"releases/{second}"
            assert os.readlink(prefix / "previous") == f"releases/{first}"
            node_pid = int((root / "var/lib/llmgw-node/llmgw-node.pid").read_text())
            await _until_ready(admin_url, node_pid, root, sessions=4)
        finally:
            if node_pid is not None:
                with_suppress_kill(node_pid)


async def _until_ready(admin_url: str, pid: int, root: Path, *, sessions: int) -> None:
    async def ready() -> bool:
        return (
            alive(pid)
            and {n["id"]: n for n in await _nodes(admin_url)}.get("gpu-3", {}).get("state") == "ready"
            and node_log_sessions(root) >= sessions
        )

    await wait_until(ready, timeout=60, interval=0.2)


async def _distributions(env: Path) -> dict[str, str]:
    listed = await trio.run_process(
        [
            str(env / "bin" / "python"),
            "-m",
            "pip",
            "--isolated",
            "list",
            "--disable-pip-version-check",
            "--format",
            "json",
        ],
        capture_stdout=True,
    )
    # pip and setuptools come with every venv (ensurepip, from the Python itself), not the release.
    return {
        canonicalize_name(d["name"]): d["version"]
        for d in json.loads(listed.stdout)
        if canonicalize_name(d["name"]) not in ("pip", "setuptools")
    }


def _pinned_files(files: Path, release_id: str) -> list[str]:
    manifest = json.loads((files / "node-releases" / release_id / "release.json").read_text())
    return [entry["name"] for entry in manifest["files"]]


def _pinned(files: Path, release_id: str) -> dict[str, str]:
    text = (files / "node-releases" / release_id / "requirements.txt").read_text()
    return {
        canonicalize_name(line.split("==")[0]): line.split("==")[1].split()[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def _recorders(bindir: Path, state: Path) -> dict[str, str]:
    """Stand-ins for the commands the systemd path runs: each records its arguments; ``id`` and
    ``useradd`` share a user database in ``state``; this machine has a video group, no render."""
    bindir.mkdir()
    log = state / "commands.log"
    bodies = {
        "id": f'[ -e "{state}/user-$1" ]',
        "useradd": f'for last; do :; done; touch "{state}/user-$last"',
        "getent": '[ "$2" = video ]',
        "usermod": "true",
        "chown": "true",
        "systemctl": "true",
    }
    env = {}
    for name, body in bodies.items():
        script = bindir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n{body}\n')
        script.chmod(0o755)
        env[f"LLMGW_{name.upper()}"] = str(script)
    return env


def _tree(root: Path) -> dict[str, tuple[int, str]]:
    """Every path under ``root``: its mode and its content's digest (or a link's target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            what = "-> " + os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            what = "dir"
        out[str(path.relative_to(root))] = (stat.S_IMODE(info.st_mode), what)
    return out


@pytest.mark.slow
async def test_the_systemd_path_in_a_scratch_root_creates_the_unit_user_and_files_and_runs_again_unchanged(
    tmp_path: Path, node_dist: Path, wheelhouse: Path
) -> None:
    files = tmp_path / "files"
    release_id = await _prepared(tmp_path, files, node_dist, wheelhouse)
    root = tmp_path / "root"
    state = tmp_path / "state"
    state.mkdir()
    recorders = _recorders(tmp_path / "bin", state)
    async with running_control(tmp_path, files) as (admin_url, _agents, _log):
        created = await _add_node(admin_url, "gpu-7", {})
        env = {**_base_env(root), **recorders, "LLMGW_INIT": "systemd"}
        code, output = await _sh(["sh", "-c", created["install_command"]], env)
        assert code == 0, output
        first = _tree(root)
        first_commands = (state / "commands.log").read_text().splitlines()
        (state / "commands.log").unlink()
        code, output = await _sh(["sh", "-c", created["install_command"]], env)
        assert code == 0, output
    assert f"release {release_id} is already installed; checking it" in output

    data = root / "var/lib/llmgw-node"
    config = root / "etc/llmgw/node.toml"
    expected = [
        "id llmgw",
        "useradd --system --home-dir /var/lib/llmgw-node --no-create-home --shell /usr/sbin/nologin llmgw",
        "getent group video",
        "usermod -aG video llmgw",
        "getent group render",
        f"chown -R llmgw:llmgw {data}",
        f"chown root:llmgw {config}",
        "systemctl daemon-reload",
        "systemctl enable llmgw-node.service",
        "systemctl restart --no-block llmgw-node.service",
    ]
    assert first_commands == expected
    # Run again: the user exists, so it is not created twice; everything else is asked again
    # (each is idempotent), and not one file, mode or link under the root changed.
    assert (state / "commands.log").read_text().splitlines() == [c for c in expected if not c.startswith("useradd")]
    assert _tree(root) == first

    unit = root / "etc/systemd/system/llmgw-node.service"
    assert unit.read_text() == node_unit() and stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert stat.S_IMODE(data.stat().st_mode) == 0o750
    loaded = load_config(config)
    # The unit's paths, not the scratch root's: this is the file systemd would run with.
    assert (loaded.node_id, loaded.token, loaded.data_dir) == ("gpu-7", created["join_token"], "/var/lib/llmgw-node")
    prefix = root / "opt/llmgw-node"
    assert os.readlink(prefix / "current") == f"releases/{release_id}"
    assert (prefix / "current/bin/llmgw-node").is_file()
    # The daemon's user cannot change the code it runs: nothing there is writable but by root.
    writable = [path for path, (mode, what) in _tree(prefix).items() if not what.startswith("->") and mode & 0o022]
    assert writable == []


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def node_log_sessions(root: Path) -> int:
    return (root / "var/lib/llmgw-node/llmgw-node.log").read_text().count("connected to control")


def with_suppress_kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
