"""The llmgw-node command: help, probe, engines install/list/check, and the daemon under SIGTERM."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
import trio
from node.conftest import TAG
from node.helpers import fake_control, receive, replica_spec
from node.hostile import engine_archive_cases
from node.release_server import FileServer
from trio_websocket import WebSocketConnection

from llmgw_dev.engine_proc import free_port
from llmgw_node.procs import start_ticks
from llmgw_shared.wire import (
    PROTOCOL_VERSION,
    Ack,
    EngineSpec,
    EngineStateReport,
    Hello,
    ReplicaState,
    ReplicaStateReport,
    SetEngines,
    StartReplica,
    WeightsSpec,
    Welcome,
    encode,
)

# Left out of the quick tier (slow: every test runs llmgw-node as a process (seconds each)).
pytestmark = pytest.mark.slow


NODE = [sys.executable, "-m", "llmgw_node"]


async def node(*args: str, check: bool = False) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(120):
        return await trio.run_process([*NODE, *args], capture_stdout=True, capture_stderr=True, check=check)


async def test_help_works_for_every_command() -> None:
    for args in (
        ["--help"],
        ["run", "--help"],
        ["probe", "--help"],
        ["engines", "--help"],
        ["engines", "install", "--help"],
    ):
        result = await node(*args)
        assert result.returncode == 0, result.stderr
        assert b"usage: llmgw-node" in result.stdout


async def test_bad_config_is_one_line_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('control = ["ws://127.0.0.1:1/agent/v1"]\nalow_os_packages = true\n')
    result = await node("run", "--config", str(config))
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.startswith(f"llmgw-node: {config}: (top level): unknown key 'alow_os_packages'")
    assert "Traceback" not in err
    missing = await node("run", "--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and b"no such file" in missing.stderr


async def test_probe_json_and_table(tmp_path: Path) -> None:
    result = await node("probe", "--json", "--data-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["facts"]["probed"] is True and out["facts"]["cores"] >= 1 and out["engines"] == []
    table = await node("probe", "--data-dir", str(tmp_path))
    assert b"engine  none" in table.stdout and b"nvidia  no driver loaded" in table.stdout


async def test_engines_install_list_check(tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    files.publish("b1", {name: data}, digests={name: "1" * 64})
    d = str(tmp_path / "data")
    bad = await node("engines", "install", "llama.cpp", "b1", "--release-api", files.release_api(), "--data-dir", d)
    assert bad.returncode == 1
    assert bad.stderr.decode().splitlines()[-1].startswith(f"llmgw-node: llama.cpp b1: failed: {name}: sha256 ")
    ok = await node("engines", "install", "llama.cpp", TAG, "--release-api", files.release_api(), "--data-dir", d)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.decode().startswith(f"llama.cpp {TAG}: installed {TAG} (version: ")
    assert f"installing: downloading {name} (6 MB, 100%)".encode() in ok.stderr
    listed = await node("engines", "list", "--data-dir", d)
    assert listed.stdout.decode().startswith(f"llama.cpp {TAG}: installed {TAG}")
    assert (await node("engines", "check", "--data-dir", d)).returncode == 0
    lib = next((tmp_path / "data" / "engines" / "llama.cpp" / TAG).rglob("libmtmd.so.0"))
    lib.unlink()
    broken = await node("engines", "check", "--data-dir", d)
    assert broken.returncode == 1
    assert b"failed: re-check: missing library: libmtmd.so.0" in broken.stdout


@pytest.mark.engine
async def test_daemon_leaves_engines_running_on_sigterm_unless_told(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes], tiny_model: Path
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    model = await trio.Path(tiny_model).read_bytes()
    weights = WeightsSpec(
        url=files.add_file("tiny.gguf", model), sha256=hashlib.sha256(model).hexdigest(), size=len(model)
    )
    port = free_port()
    ready: list[ReplicaState] = []
    hellos: list[Hello] = []
    got_ready = trio.Event()

    async def control(ws: WebSocketConnection) -> None:
        hello = await receive(ws)
        assert isinstance(hello, Hello)
        hellos.append(hello)
        await ws.send_message(encode(Welcome(protocol_version=PROTOCOL_VERSION, heartbeat_interval_s=0.5)))
        for replica in hello.replicas:
            # An adopted engine may be ready before the node connects: the hello says so.
            if replica.status == "ready":
                ready.append(replica)
                got_ready.set()
        if len(hellos) == 1:
            await ws.send_message(
                encode(SetEngines(id="e", fencing_token=1, engines=[EngineSpec("llama.cpp", TAG, files.release_api())]))
            )
        started = len(hellos) > 1
        while True:
            msg = await receive(ws, 60)
            if isinstance(msg, EngineStateReport) and msg.engine.status == "installed" and not started:
                started = True
                await ws.send_message(
                    encode(StartReplica(id="s", fencing_token=1, replica=replica_spec("tiny-0", weights, port)))
                )
            elif isinstance(msg, ReplicaStateReport) and msg.replica.status == "ready":
                ready.append(msg.replica)
                got_ready.set()
            elif isinstance(msg, Ack):
                assert msg.ok, msg.error

    async with fake_control(control) as url:
        config = tmp_path / "node.toml"
        config.write_text(
            f'control = ["{url}"]\ntoken = "llmgw-join-abc"\nnode_id = "n1"\n'
            f'data_dir = "{tmp_path / "data"}"\nreconnect_min_s = 0.05\n'
        )

        async def daemon(*extra: str) -> int:
            proc = await trio.lowlevel.open_process(
                [*NODE, "run", "--config", str(config), *extra], stderr=subprocess.DEVNULL
            )
            try:
                with trio.fail_after(60):
                    await got_ready.wait()
                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(30):
                    return await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()

        assert await daemon() == 0
        engine_pid = ready[0].pid
        # The daemon is gone; its engine still serves.
        assert start_ticks(engine_pid) is not None
        async with httpx2.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200

        got_ready = trio.Event()
        assert await daemon("--stop-engines") == 0
    # The second daemon adopted the same engine (no restart), then stopped it on SIGTERM as told.
    assert hellos[1].replicas and hellos[1].replicas[0].replica_id == "tiny-0"
    assert ready[-1].pid == engine_pid
    # Gone (a zombie counts as gone: whoever inherited the orphan reaps it, not us).
    assert start_ticks(engine_pid) is None


async def test_a_version_that_is_not_one_name_is_refused_and_deletes_nothing(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    d = str(tmp_path / "data")
    assert (
        await node("engines", "install", "llama.cpp", TAG, "--release-api", files.release_api(), "--data-dir", d)
    ).returncode == 0
    for version in (".", "", "../../x"):
        bad = await node(
            "engines", "install", "llama.cpp", version, "--release-api", files.release_api(), "--data-dir", d
        )
        err = bad.stderr.decode()
        assert bad.returncode == 1, err
        assert err.splitlines()[-1] == (
            f"llmgw-node: llama.cpp {version}: failed: version {version!r} is not valid: "
            "use 1-64 letters, digits, '.', '_', '+' or '-', starting with a letter or "
            "digit"
        )
        assert "Traceback" not in err
    listed = await node("engines", "list", "--data-dir", d)
    assert listed.stdout.decode().startswith(f"llama.cpp {TAG}: installed {TAG}")


ARCHIVE_CASES = engine_archive_cases(f"llama-{TAG}")


@pytest.mark.parametrize(("case", "suffix", "archive", "message"), ARCHIVE_CASES, ids=[c[0] for c in ARCHIVE_CASES])
async def test_each_bad_archive_is_one_line_and_exit_1(
    tmp_path: Path, files: FileServer, case: str, suffix: str, archive: bytes, message: str
) -> None:
    files.publish(TAG, {f"llama-{TAG}-bin-ubuntu-x64{suffix}": archive})
    data = tmp_path.joinpath("a", "b", "c", "d", "data")
    result = await node(
        "engines", "install", "llama.cpp", TAG, "--release-api", files.release_api(), "--data-dir", str(data)
    )
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith(f"llmgw-node: llama.cpp {TAG}: failed: ") and message in last, last
    assert not (tmp_path / "PWNED").exists()
