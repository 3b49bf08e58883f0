"""A clean stop: both daemons of the demo stop on SIGINT or SIGTERM with one line each, no traceback.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group; systemd sends SIGTERM.
Either way each daemon says it stopped, once, and exits 0; a second signal while it is stopping
("out now") exits 130, still without a traceback. The demo itself keeps its daemons out of the
terminal's process group and hands each exactly one SIGTERM on Ctrl-C.

A program a script starts in the background (`cmd &` in a non-interactive shell) inherits SIGINT
ignored, and Python then leaves it ignored: the demo and both daemons install their own SIGINT
handling, so `kill -INT` stops them there too, and these tests pass when pytest itself runs so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Protocol

import pytest

from llmgw_dev import build_engine, demo
from llmgw_dev.engine_proc import free_port
from support.waiting import wait_until_sync

# Every test here starts the daemons as processes: the quick tier (-m "not system") leaves them out.
pytestmark = pytest.mark.system

# Long enough for two daemons to start on a busy 2-core machine; a bound, not a sleep.
_START_SECONDS = 60
_STOP_SECONDS = 30


class _Process(Protocol):
    """What these tests do with a started program: a Popen, or a background job of a script."""

    def send_signal(self, signum: int) -> None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def _popen(command: list[str], stderr: IO[bytes]) -> _Process:
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)


class _BackgroundJob:
    """``command &`` in a non-interactive bash script, which starts it with SIGINT (and SIGQUIT)
    ignored; signals go to the program itself, and the script's ``wait`` hands back its status."""

    def __init__(
        self,
        command: list[str],
        stdout: IO[bytes] | int,
        stderr: IO[bytes] | int,
        *,
        env: dict[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        read_end, write_end = os.pipe()
        # The job's pid comes back on a pipe of its own, so the program keeps the script's stdout.
        script = f'"$@" {write_end}>&- & echo $! >&{write_end}; exec {write_end}>&-; wait $!'
        self.shell = subprocess.Popen(
            ["bash", "-c", script, "bash", *command],
            stdout=stdout,
            stderr=stderr,
            pass_fds=(write_end,),
            env=env,
            start_new_session=new_session,
        )
        os.close(write_end)
        with os.fdopen(read_end) as pid_line:
            self.pid = int(pid_line.readline())

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def poll(self) -> int | None:
        return self.shell.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.shell.wait(timeout)

    def kill(self) -> None:
        if self.shell.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.shell.wait()


def _background(command: list[str], stderr: IO[bytes]) -> _Process:
    return _BackgroundJob(command, subprocess.DEVNULL, stderr)


def _exit_watch(process: _Process) -> subprocess.Popen[bytes]:
    """The Popen whose exit is the program's: itself, or the script that waits for it."""
    if isinstance(process, _BackgroundJob):
        return process.shell
    assert isinstance(process, subprocess.Popen)
    return process


_LAUNCHERS: dict[str, Callable[[list[str], IO[bytes]], _Process]] = {
    "foreground": _popen,
    "background-job": _background,
}


def test_a_background_job_of_a_script_starts_with_sigint_ignored(tmp_path: Path) -> None:
    """The premise of the background-job cases: without it they would test nothing."""
    probe = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"]
    with open(tmp_path / "out", "wb") as out:
        job = _BackgroundJob(probe, out, subprocess.DEVNULL)
        assert job.wait(_STOP_SECONDS) == 0
    assert (tmp_path / "out").read_text().strip() == "True"


@contextmanager
def _daemons(
    tmp: Path, launch: Callable[[list[str], IO[bytes]], _Process] = _popen
) -> Iterator[tuple[_Process, _Process, Path, Path]]:
    """The demo's two daemons on its configs, a stand-in model and engine archive (no engine runs:
    nothing asks for the model, and the node's engine install fails on the junk archive, locally)."""
    (tmp / "model.gguf").write_bytes(b"not a model")
    archive = tmp / build_engine.archive_name()
    archive.write_bytes(b"not an archive")
    ports = {"api": free_port(), "admin": free_port(), "agents": free_port()}
    control_toml, node_toml = demo.prepare(tmp / "demo", tmp / "model.gguf", archive, ports)
    control_err, node_err = tmp / "control.err", tmp / "node.err"
    with open(control_err, "wb") as c_err, open(node_err, "wb") as n_err:
        control = launch([str(demo.BIN / "llmgw-control"), "run", "--config", str(control_toml)], c_err)
        node: _Process | None = None
        try:
            demo.wait_healthy(f"http://127.0.0.1:{ports['api']}", _exit_watch(control), "llmgw-control", _START_SECONDS)
            node = launch([str(demo.BIN / "llmgw-node"), "run", "--config", str(node_toml), "--stop-engines"], n_err)
            # Connected: the node's session is up, so the stop below is of a working pair.
            _wait_for(control_err, "node demo-node connected", node)
            yield control, node, control_err, node_err
        finally:
            for process in (node, control):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()


def _wait_for(path: Path, text: str, process: _Process, timeout: float = _START_SECONDS) -> None:
    def said() -> bool:
        if text in path.read_text(errors="replace"):
            return True
        assert process.poll() is None, f"exited with {process.poll()}:\n{path.read_text(errors='replace')}"
        return False

    try:
        wait_until_sync(said, timeout=timeout)
    except TimeoutError:
        raise AssertionError(f"no {text!r} in:\n{path.read_text(errors='replace')}") from None


def _assert_clean(stderr: str, stop_line: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert stderr.count(stop_line) == 1, stderr


@pytest.mark.parametrize("launch", sorted(_LAUNCHERS))
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_each_daemon_stops_with_one_line(tmp_path: Path, signum: signal.Signals, launch: str) -> None:
    with _daemons(tmp_path, _LAUNCHERS[launch]) as (control, node, control_err, node_err):
        node.send_signal(signum)
        control.send_signal(signum)
        assert node.wait(_STOP_SECONDS) == 0
        assert control.wait(_STOP_SECONDS) == 0
    _assert_clean(node_err.read_text(), "llmgw-node stopped")
    _assert_clean(control_err.read_text(), "llmgw-control stopped")


def test_a_second_signal_while_stopping_is_out_now_without_a_traceback(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the group) and then SIGTERM from whoever started the daemon."""
    with _daemons(tmp_path) as (control, node, control_err, node_err):
        for process, err in ((node, node_err), (control, control_err)):
            process.send_signal(signal.SIGINT)
            _wait_for(err, "SIGINT received", process)
            process.send_signal(signal.SIGTERM)
        # Out now (130) when the second signal found it still stopping, else it had stopped (0).
        assert node.wait(_STOP_SECONDS) in (0, 130)
        assert control.wait(_STOP_SECONDS) in (0, 130)
    for err in (node_err, control_err):
        assert "Traceback" not in err.read_text(), err.read_text()


@pytest.mark.engine
def test_ctrl_c_on_the_demo_stops_both_daemons_with_one_line_each(tmp_path: Path) -> None:
    """The whole demo (real engine, tiny model, a cold start), then Ctrl-C as a terminal sends it:
    SIGINT to the demo's process group."""
    command = [sys.executable, "-m", "llmgw_dev.demo", "--port", str(free_port()), "--dir", str(tmp_path / "demo")]
    env = {**os.environ, "PYTHONPATH": str(Path(demo.__file__).parents[1])}
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        # Its own session: the process group a terminal would have made for it.
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, start_new_session=True)
        try:

            def ready() -> bool:  # the demo's "ready" banner in its output
                if "Press Ctrl-C to stop." in (tmp_path / "out").read_text():
                    return True
                assert process.poll() is None, (tmp_path / "err").read_text()
                return False

            try:
                wait_until_sync(ready, timeout=300, interval=0.1)
            except TimeoutError:
                raise AssertionError((tmp_path / "err").read_text()) from None
            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(_STOP_SECONDS * 2) == 0
        finally:
            if process.poll() is None:
                _end_session(process.pid)
                process.wait()
    stderr = (tmp_path / "err").read_text()
    _assert_clean(stderr, "llmgw-node stopped")
    _assert_clean(stderr, "llmgw-control stopped")
    assert "again: stopping now" not in stderr, stderr


@pytest.mark.engine
def test_kill_int_stops_the_demo_started_as_a_background_job_of_a_script(tmp_path: Path) -> None:
    """``python3 dev.py demo &`` in a script, then ``kill -INT`` to the demo alone: it stops both
    daemons and exits 0, though it started with SIGINT ignored."""
    command = [sys.executable, "-m", "llmgw_dev.demo", "--port", str(free_port()), "--dir", str(tmp_path / "demo")]
    env = {**os.environ, "PYTHONPATH": str(Path(demo.__file__).parents[1])}
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        # Its own session, so that whatever is left can be killed as a group at the end.
        job = _BackgroundJob(command, out, err, env=env, new_session=True)
        try:
            _wait_for(tmp_path / "out", "Press Ctrl-C to stop.", job, timeout=300)
            job.send_signal(signal.SIGINT)
            assert job.wait(_STOP_SECONDS * 2) == 0
        finally:
            if job.poll() is None:
                _end_session(job.shell.pid)
                job.shell.wait()
    stderr = (tmp_path / "err").read_text()
    _assert_clean(stderr, "llmgw-node stopped")
    _assert_clean(stderr, "llmgw-control stopped")


def _end_session(sid: int) -> None:
    """Stop every process of a session a test started: the demo's daemons are in process groups
    of their own, so a kill of the demo's group would leave them (and the node's engine) running.
    SIGTERM first, so that the node stops its engine; SIGKILL for whatever is left."""

    def members() -> list[int]:
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue  # gone meanwhile
            # The fields after the command: state, ppid, pgrp, session; a zombie is already gone.
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(stat.parent.name))
        return pids

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(TimeoutError):
            wait_until_sync(lambda: not members(), timeout=_STOP_SECONDS, interval=0.1)
