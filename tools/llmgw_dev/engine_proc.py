"""Run a real ``llama-server`` as a child process for tests and the demo.

Two flavours of the same thing: ``running_llama_server`` (async, for trio code) and
``llama_server_process`` (sync, for session-scoped pytest fixtures, which pytest-trio cannot make
async, and for scripts). Both start the server in its own session and signal the whole process
group on exit (SIGTERM, then SIGKILL after a grace period), because signalling only the child
would leave grandchildren running (see STACK.md, "Processes").

The server's output goes to a log file rather than a pipe: nobody reads a pipe during a long test
session, and a full pipe would block the server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path

import attrs
import trio

HEALTH_DEADLINE = 30.0
STOP_GRACE = 5.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the usual race: bind it soon)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@attrs.frozen
class LlamaServer:
    url: str
    port: int
    #: the alias: what responses report as ``model``.
    model: str
    pid: int
    log_path: Path
    api_key: str | None = None

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)


def llama_server_command(
    binary: Path,
    model: Path,
    *,
    port: int,
    alias: str = "tiny",
    embeddings: bool = False,
    api_key: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    # -t 1: with the default thread count a short answer once took 21 s on a loaded 2-core machine.
    # -np 4 with -c 1024 gives four parallel slots of 256 tokens each: enough for tests.
    cmd = [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        "1",
        "-c",
        "1024",
        "-np",
        "4",
        "--metrics",
        "--alias",
        alias,
    ]
    if embeddings:
        cmd += ["--embeddings", "--pooling", "mean"]
    if api_key is not None:
        cmd += ["--api-key", api_key]
    return cmd + list(extra_args)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _drop_log(log_path: Path, clean: bool) -> None:
    """Keep the log only when something went wrong: it is what explains the failure afterwards."""
    if clean:
        log_path.unlink(missing_ok=True)


class EngineStartError(RuntimeError):
    pass


def _new_log(alias: str) -> Path:
    fd, name = tempfile.mkstemp(prefix=f"llama-server-{alias}-", suffix=".log")
    os.close(fd)
    return Path(name)


@contextmanager
def llama_server_process(
    binary: Path,
    model: Path,
    *,
    port: int = 0,
    alias: str = "tiny",
    embeddings: bool = False,
    api_key: str | None = None,
    extra_args: Sequence[str] = (),
    health_deadline: float = HEALTH_DEADLINE,
) -> Iterator[LlamaServer]:
    """Start llama-server, wait for ``/health`` to answer 200, stop the process group on exit."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = _new_log(alias)
    cmd = llama_server_command(
        binary, model, port=port, alias=alias, embeddings=embeddings, api_key=api_key, extra_args=extra_args
    )
    clean = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + health_deadline
        while not _health_ok(url):
            if proc.poll() is not None:
                raise EngineStartError(f"llama-server exited with {proc.returncode}:\n{_tail(log_path, 40)}")
            if time.monotonic() > deadline:
                raise EngineStartError(f"llama-server not healthy after {health_deadline} s:\n{_tail(log_path, 40)}")
            time.sleep(0.05)
        yield LlamaServer(url=url, port=port, model=alias, pid=proc.pid, log_path=log_path, api_key=api_key)
        clean = True
    finally:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        _drop_log(log_path, clean)


@asynccontextmanager
async def running_llama_server(
    binary: Path,
    model: Path,
    *,
    port: int = 0,
    alias: str = "tiny",
    embeddings: bool = False,
    api_key: str | None = None,
    extra_args: Sequence[str] = (),
    health_deadline: float = HEALTH_DEADLINE,
) -> AsyncIterator[LlamaServer]:
    """The trio flavour of :func:`llama_server_process`."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = _new_log(alias)
    cmd = llama_server_command(
        binary, model, port=port, alias=alias, embeddings=embeddings, api_key=api_key, extra_args=extra_args
    )
    clean = False
    # A plain descriptor: the child inherits it, and opening a local temp file does not block.
    log_fd = os.open(log_path, os.O_WRONLY | os.O_TRUNC)
    try:
        proc = await trio.lowlevel.open_process(
            cmd, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        os.close(log_fd)
    try:
        with trio.fail_after(health_deadline):
            while not await _health_ok_async(url):
                if proc.poll() is not None:
                    raise EngineStartError(f"llama-server exited with {proc.returncode}:\n{_tail(log_path, 40)}")
                await trio.sleep(0.05)
        yield LlamaServer(url=url, port=port, model=alias, pid=proc.pid, log_path=log_path, api_key=api_key)
        clean = True
    finally:
        _drop_log(log_path, clean)
        # Shielded: this runs on cancellation too, and the engine must not outlive its owner.
        with trio.CancelScope(shield=True):
            _signal_group(proc.pid, signal.SIGTERM)
            with trio.move_on_after(STOP_GRACE):
                await proc.wait()
            if proc.returncode is None:
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()


async def _health_ok_async(url: str) -> bool:
    """GET /health over a raw trio socket: one tiny request does not justify an HTTP client here."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        with trio.move_on_after(1.0):
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                await stream.send_all(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
                head = await stream.receive_some(64)
                return head.startswith(b"HTTP/1.1 200")
    except OSError:
        return False
    return False
