"""systemd's notify protocol, against a datagram socket the test listens on.

The daemons are also run as processes with ``NOTIFY_SOCKET`` pointing at the test's socket, the
way systemd runs them with ``Type=notify``: READY=1 must come only once the daemon can serve,
STOPPING=1 on SIGTERM, WATCHDOG=1 on its period.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO

import httpx2
import pytest
import tomli_w
import trio

from llmgw_dev.engine_proc import free_port
from llmgw_shared import sdnotify

# Starts llmgw daemons as processes (the quick tier, -m "not system", leaves these out).
pytestmark = pytest.mark.system


BIN = Path(sys.executable).parent
# The node joins as in production: with a token whose digest control's config lists.
JOIN_TOKEN = "llmgw-join-sdnotify-test"


class Listener:
    """A bound AF_UNIX datagram socket: what systemd's notify socket looks like to a daemon."""

    def __init__(self, sock: trio.socket.SocketType, name: str) -> None:
        self.sock = sock
        self.name = name

    async def receive(self, timeout: float = 10) -> list[str]:
        with trio.fail_after(timeout):
            data = await self.sock.recv(4096)
        return data.decode().split("\n")

    async def until(self, state: str, timeout: float = 30) -> list[list[str]]:
        """Every message up to and including the first that carries ``state``."""
        seen = []
        with trio.fail_after(timeout):
            while True:
                message = await self.receive(timeout)
                seen.append(message)
                if state in message:
                    return seen


@asynccontextmanager
async def notify_socket(tmp_path: Path, *, abstract: bool = False) -> AsyncIterator[Listener]:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with sock:
        if abstract:
            name = f"@llmgw-test-{os.getpid()}-{id(sock)}"
            await sock.bind(b"\0" + name[1:].encode())
        else:
            name = str(tmp_path / "notify.sock")
            await sock.bind(name)
        yield Listener(sock, name)


@pytest.mark.parametrize("abstract", [False, True])
async def test_messages_reach_the_socket(tmp_path: Path, abstract: bool) -> None:
    async with notify_socket(tmp_path, abstract=abstract) as listener:
        env = {"NOTIFY_SOCKET": listener.name}
        assert await sdnotify.ready("serving", environ=env)
        assert await listener.receive() == ["READY=1", "STATUS=serving"]
        assert await sdnotify.stopping(environ=env)
        assert await listener.receive() == ["STOPPING=1"]


async def test_without_notify_socket_nothing_is_sent_and_nothing_fails() -> None:
    assert sdnotify.notify_address({}) is None
    assert not await sdnotify.ready(environ={})
    with trio.fail_after(1):
        # No watchdog without a socket: the task returns instead of looping.
        await sdnotify.watchdog_loop({"WATCHDOG_USEC": "1000000"})


async def test_a_missing_socket_is_logged_not_raised(tmp_path: Path) -> None:
    assert not await sdnotify.ready(environ={"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})


def test_watchdog_interval_is_half_of_watchdog_sec_and_only_for_this_process() -> None:
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 15.0
    # Inherited from a parent: the watchdog is someone else's.
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval({}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "soon"}) is None


async def test_watchdog_loop_pings_on_its_period(tmp_path: Path) -> None:
    async with notify_socket(tmp_path) as listener, trio.open_nursery() as nursery:
        env = {"NOTIFY_SOCKET": listener.name, "WATCHDOG_USEC": "200000"}
        interval = await nursery.start(sdnotify.watchdog_loop, env)
        assert interval == pytest.approx(0.1)
        start = trio.current_time()
        for _ in range(4):
            assert await listener.receive() == ["WATCHDOG=1"]
        # Four pings at 0.1 s spacing: the first at once, the fourth after three periods.
        assert 0.25 < trio.current_time() - start < 2
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------- the daemons as processes


def _log(tmp_path: Path, name: str) -> BinaryIO:
    return open(tmp_path / f"{name}.log", "ab")


async def _spawn(argv: list[str], tmp_path: Path, name: str, env: dict[str, str] | None = None) -> trio.Process:
    """The daemon with its output in ``<name>.log``, for reading when a test fails."""
    with _log(tmp_path, name) as out:
        return await trio.lowlevel.open_process(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def _env(listener: Listener) -> dict[str, str]:
    return {**os.environ, "NOTIFY_SOCKET": listener.name, "WATCHDOG_USEC": "400000"}


async def _wait_exit(process: trio.Process, timeout: float = 20) -> int:
    with trio.fail_after(timeout):
        return await process.wait()


async def test_control_is_ready_once_listening_and_says_stopping(tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    config = tmp_path / "control.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "listen": f"127.0.0.1:{port}",
                "admin_listen": f"127.0.0.1:{admin}",
                "data_dir": str(tmp_path / "control"),
                "shutdown_grace": 1.0,
            }
        )
    )
    async with notify_socket(tmp_path) as listener:
        process = await _spawn(
            [str(BIN / "llmgw-control"), "run", "--config", str(config)], tmp_path, "control", _env(listener)
        )
        try:
            before = await listener.until("READY=1")
            # The watchdog started with the daemon, before it was ready.
            assert ["WATCHDOG=1"] in before
            # READY=1 means listening: the API answers now, with no retry loop.
            async with httpx2.AsyncClient() as client:
                assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
            assert await listener.until("WATCHDOG=1", timeout=5)
            process.send_signal(signal.SIGTERM)
            await listener.until("STOPPING=1")
            assert await _wait_exit(process) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def _node(tmp_path: Path, listener: Listener, **config: object) -> trio.Process:
    path = tmp_path / "node.toml"
    path.write_text(tomli_w.dumps({"node_id": "n1", "data_dir": str(tmp_path / "node"), **config}))
    return await _spawn([str(BIN / "llmgw-node"), "run", "--config", str(path)], tmp_path, "node", _env(listener))


async def test_a_standalone_node_is_ready_once_running(tmp_path: Path) -> None:
    async with notify_socket(tmp_path) as listener:
        process = await _node(tmp_path, listener)
        try:
            messages = await listener.until("READY=1")
            assert any("STATUS=running standalone" in line for line in messages[-1])
            process.send_signal(signal.SIGTERM)
            await listener.until("STOPPING=1")
            assert await _wait_exit(process) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_a_node_is_ready_only_once_control_welcomed_it(tmp_path: Path) -> None:
    agent_port = free_port()
    url = f"ws://127.0.0.1:{agent_port}/agent/v1"
    async with notify_socket(tmp_path) as listener:
        node = await _node(
            tmp_path, listener, control=[url], token=JOIN_TOKEN, reconnect_min_s=0.1, reconnect_max_s=0.3
        )
        control = None
        try:
            # Control is not there yet: the node says so, keeps its watchdog fed, and is not ready.
            with trio.move_on_after(2):
                while True:
                    message = await listener.receive()
                    assert "READY=1" not in message
            config = tmp_path / "control.toml"
            config.write_text(
                tomli_w.dumps(
                    {
                        "listen": f"127.0.0.1:{free_port()}",
                        "admin_listen": f"127.0.0.1:{free_port()}",
                        "data_dir": str(tmp_path / "control"),
                        "shutdown_grace": 1.0,
                        "engines": [],
                        "agents": {
                            "listen": f"127.0.0.1:{agent_port}",
                            "join_token_digests": ["sha256:" + hashlib.sha256(JOIN_TOKEN.encode()).hexdigest()],
                        },
                    }
                )
            )
            control = await _spawn([str(BIN / "llmgw-control"), "run", "--config", str(config)], tmp_path, "control")
            messages = await listener.until("READY=1")
            assert f"STATUS=connected to {url}" in messages[-1]
        finally:
            for process in (node, control):
                if process is not None and process.returncode is None:
                    process.kill()
                    await process.wait()
