"""A real ``llmgw-node run`` driven over the real WebSocket protocol with every hostile release.

The node is a subprocess with its data directory on a small tmpfs; control is a trio-websocket
server on 127.0.0.1 speaking the wire protocol; releases come from the local release server.
Control first starts a replica on an engine the node has (a configured fake engine), then asks for
one llama.cpp version per hostile class at once. Each must end ``failed`` with its reason, while
the daemon stays up, on the same connection, still serving the replica and still taking commands;
asking again does not start the installs again (they back off).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import httpx2
import pytest
import trio
from node import hostile
from node.helpers import fake_control, receive, replica_spec, small_filesystem
from node.release_server import FileServer
from trio_websocket import ConnectionClosed, WebSocketConnection

import llmgw_dev
from llmgw_dev.engine_proc import free_port
from llmgw_shared.wire import (
    PROTOCOL_VERSION,
    Ack,
    EngineSpec,
    EngineState,
    EngineStateReport,
    Heartbeat,
    Hello,
    Message,
    ReplicaStateReport,
    SetEngines,
    StartReplica,
    StopReplica,
    WeightsSpec,
    Welcome,
    encode,
)

# Starts llmgw daemons as processes (the quick tier, -m "not system", leaves these out).
pytestmark = pytest.mark.system


NODE = [sys.executable, "-m", "llmgw_node"]
VERSION_RULE = "is not valid: use 1-64 letters, digits, '.', '_', '+' or '-', starting with a letter or digit"


def _releases(files: FileServer) -> dict[str, str]:
    """Publish one release per hostile class; version -> words its failure must contain."""
    expected: dict[str, str] = {}
    for i, (_case, suffix, archive, message) in enumerate(hostile.engine_archive_cases("llama-top")):
        version = f"b90{i:02d}"
        files.publish(version, {f"llama-{version}-bin-ubuntu-x64{suffix}": archive})
        expected[version] = message
    # A bomb: 1 MB on the wire, 256 MiB unpacked, on a data disk of 320 MiB (256 kept free).
    files.publish("b9100", {"llama-b9100-bin-ubuntu-x64.tar.gz": hostile.gzip_bomb(256 << 20)})
    expected["b9100"] = "failed: not enough disk for unpacking llama-b9100-bin-ubuntu-x64.tar.gz: needs "
    good = hostile.tar_gz([("llama-top/llama-server", {"data": b"#!/bin/sh\n", "mode": 0o755})])
    files.publish(
        "b9101",
        {"llama-b9101-bin-ubuntu-x64.tar.gz": good},
        listed_as={"llama-b9101-bin-ubuntu-x64.tar.gz": {"name": "llama-b9101/../../../../x-bin-ubuntu-x64.tar.gz"}},
    )
    expected["b9101"] = "asset name 'llama-b9101/../../../../x-bin-ubuntu-x64.tar.gz' is not valid"
    files.publish(
        "b9102",
        {"llama-b9102-bin-ubuntu-x64.tar.gz": good},
        listed_as={"llama-b9102-bin-ubuntu-x64.tar.gz": {"digest": "sha256:../../../x"}},
    )
    expected["b9102"] = "digest 'sha256:../../../x' is not valid"
    return expected


# Versions that may not name a folder: refused in the command's ack, never a state or a report
# (control's decoder refuses a report naming one, as it refuses every bad name from a node).
BAD_VERSIONS = (".", "", "../../x")


def _fake_engine(tmp_path: Path) -> Path:
    """An engine the node has by config: the fake engine, answering /health on its port."""
    tools = Path(llmgw_dev.__file__).resolve().parents[1]
    script = tmp_path / "keep-engine"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "keep 1.0"; exit 0; fi\n'
        f'PYTHONPATH="{tools}" exec {sys.executable} -m llmgw_dev.fake_engine --host 127.0.0.1 '
        '--port "$1"\n'
    )
    script.chmod(0o755)
    return script


async def test_every_hostile_release_is_a_failed_engine_and_the_node_keeps_serving(
    tmp_path: Path, files: FileServer
) -> None:
    expected = _releases(files)
    weights_path = tmp_path / "w.gguf"
    model = b"weights" * 100
    weights_path.write_bytes(model)
    weights = WeightsSpec(url=str(weights_path), sha256=hashlib.sha256(model).hexdigest(), size=len(model))
    port = free_port()
    keep = StartReplica(
        id="start",
        fencing_token=1,
        replica=attrs.evolve(replica_spec("keep-0", weights, port, args=["{port}"]), engine="keep", engine_version="1"),
    )
    hellos: list[Hello] = []
    sockets: list[WebSocketConnection] = []
    inbox_send, inbox = trio.open_memory_channel[Message](10000)
    welcomed = trio.Event()
    engine_pids: list[int] = []

    async def control(ws: WebSocketConnection) -> None:
        hello = await receive(ws)
        assert isinstance(hello, Hello)
        hellos.append(hello)
        sockets.append(ws)
        await ws.send_message(encode(Welcome(protocol_version=PROTOCOL_VERSION, heartbeat_interval_s=0.3)))
        welcomed.set()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_beat, ws)
                while True:
                    await inbox_send.send(await receive(ws, 60))
        except* ConnectionClosed:
            pass  # the node stopping, at the end of the test

    with small_filesystem(tmp_path / "disk", "320m") as disk:
        data = disk / "data"
        victim = disk / "victim"
        victim.write_text("secret")
        victim.chmod(0o600)
        async with fake_control(control) as url:
            config = tmp_path / "node.toml"
            config.write_text(
                f'control = ["{url}"]\ntoken = "llmgw-join-abc"\nnode_id = "n1"\ndata_dir = "{data}"\n'
                f'reconnect_min_s = 0.05\n[[engines]]\nname = "keep"\npath = "{_fake_engine(tmp_path)}"\n'
                'version = "1"\n'
            )
            proc = await trio.lowlevel.open_process(
                [*NODE, "run", "--config", str(config), "--stop-engines"], stderr=(tmp_path / "node.log").open("wb")
            )
            try:
                with trio.fail_after(60):
                    await welcomed.wait()
                ws = sockets[0]
                await ws.send_message(encode(keep))
                ready = await _until(inbox, lambda m: isinstance(m, ReplicaStateReport) and m.replica.status == "ready")
                assert isinstance(ready, ReplicaStateReport)
                engine_pids.append(ready.replica.pid)

                specs = [EngineSpec("llama.cpp", v, files.release_api()) for v in (*expected, *BAD_VERSIONS)]
                await ws.send_message(encode(SetEngines(id="hostile", fencing_token=1, engines=specs)))
                ack: Ack | None = None
                failed: dict[str, EngineState] = {}
                with trio.fail_after(120):
                    while ack is None or set(failed) != set(expected):
                        msg = await inbox.receive()
                        if isinstance(msg, Ack) and msg.command_id == "hostile":
                            ack = msg
                        for engine in _engines_in(msg):
                            assert engine.status != "installed", engine
                            if engine.status == "failed" and engine.name == "llama.cpp":
                                failed[engine.version] = engine
                assert not ack.ok
                for version in BAD_VERSIONS:
                    assert f"version {version!r} {VERSION_RULE}" in ack.error, ack.error
                for version, words in expected.items():
                    assert words in failed[version].describe(), (version, failed[version].describe())
                    assert "\n" not in failed[version].describe()

                # Still the same daemon on the same connection, serving its replica, taking commands.
                assert proc.returncode is None and len(hellos) == 1
                async with httpx2.AsyncClient() as client:
                    assert (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200
                await ws.send_message(encode(StopReplica(id="noop", fencing_token=1, replica_id="not-running")))
                await _until(inbox, lambda m: isinstance(m, Ack) and m.command_id == "noop" and m.ok)

                # Control asking again is not a retry: no index is fetched again within the backoff.
                fetched = len(files.index_requests)
                await ws.send_message(encode(SetEngines(id="again", fencing_token=1, engines=specs)))
                again = await _until(inbox, lambda m: isinstance(m, Ack) and m.command_id == "again")
                assert isinstance(again, Ack) and again.error == ack.error
                for _ in range(3):  # three heartbeats later, the node has had time to act on it
                    await _until(inbox, lambda m: isinstance(m, Heartbeat))
                assert len(files.index_requests) == fetched
                assert proc.returncode is None and len(hellos) == 1

                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(30):
                    assert await proc.wait() == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                    for pid in engine_pids:  # the killed daemon left its engine running: ours to stop
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(pid, signal.SIGKILL)
        # Nothing above the data directory: no escape landed, the victim kept its mode.
        assert sorted(os.listdir(disk)) == ["data", "victim"]
        assert stat.S_IMODE(victim.stat().st_mode) == 0o600
        assert not any((data / "engines" / ".staging").iterdir())


async def _beat(ws: WebSocketConnection) -> None:
    """Control's own heartbeats: without them the node's watchdog calls control hung."""
    seq = 0
    while True:
        seq += 1
        await ws.send_message(encode(Heartbeat(seq=seq)))
        await trio.sleep(0.3)


def _engines_in(msg: Message) -> list[EngineState]:
    if isinstance(msg, EngineStateReport):
        return [msg.engine]
    if isinstance(msg, Heartbeat):
        return list(msg.engines)
    return []


async def _until(
    inbox: trio.MemoryReceiveChannel[Message], pred: Callable[[Message], bool], limit_s: float = 60.0
) -> Message:
    with trio.fail_after(limit_s):
        while True:
            msg = await inbox.receive()
            if pred(msg):
                return msg
