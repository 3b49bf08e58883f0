"""A clean stop: both daemons of the demo stop on SIGINT or SIGTERM with one line each, no traceback.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group; systemd sends SIGTERM.
Either way each daemon says it stopped, once, and exits 0; a second signal while it is stopping
("out now") exits 130, still without a traceback. The demo itself keeps its daemons out of the
terminal's process group and hands each exactly one SIGTERM on Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from llmgw_dev import build_engine, demo
from llmgw_dev.engine_proc import free_port
from support.waiting import wait_until_sync

# Every test here starts the daemons as processes: the quick tier (-m "not system") leaves them out.
pytestmark = pytest.mark.system

# Long enough for two daemons to start on a busy 2-core machine; a bound, not a sleep.
_START_SECONDS = 60
_STOP_SECONDS = 30


@contextmanager
def _daemons(tmp: Path) -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], Path, Path]]:
    """The demo's two daemons on its configs, a stand-in model and engine archive (no engine runs:
    nothing asks for the model, and the node's engine install fails on the junk archive, locally)."""
    (tmp / "model.gguf").write_bytes(b"not a model")
    archive = tmp / build_engine.archive_name()
    archive.write_bytes(b"not an archive")
    ports = {"api": free_port(), "admin": free_port(), "agents": free_port()}
    control_toml, node_toml = demo.prepare(tmp / "demo", tmp / "model.gguf", archive, ports)
    control_err, node_err = tmp / "control.err", tmp / "node.err"
    with open(control_err, "wb") as c_err, open(node_err, "wb") as n_err:
        control = subprocess.Popen([str(demo.BIN / "llmgw-control"), "run", "--config", str(control_toml)],
                                   stdout=subprocess.DEVNULL, stderr=c_err)
        node: subprocess.Popen[bytes] | None = None
        try:
            demo.wait_healthy(f"http://127.0.0.1:{ports['api']}", control, "llmgw-control", _START_SECONDS)
            node = subprocess.Popen([str(demo.BIN / "llmgw-node"), "run", "--config", str(node_toml),
                                     "--stop-engines"], stdout=subprocess.DEVNULL, stderr=n_err)
            # Connected: the node's session is up, so the stop below is of a working pair.
            _wait_for(control_err, "node demo-node connected", node)
            yield control, node, control_err, node_err
        finally:
            for process in (node, control):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()


def _wait_for(path: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    def said() -> bool:
        if text in path.read_text(errors="replace"):
            return True
        assert process.poll() is None, f"exited with {process.returncode}:\n{path.read_text(errors='replace')}"
        return False
    try:
        wait_until_sync(said, timeout=_START_SECONDS)
    except TimeoutError:
        raise AssertionError(f"no {text!r} in:\n{path.read_text(errors='replace')}") from None


def _assert_clean(stderr: str, stop_line: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert stderr.count(stop_line) == 1, stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_each_daemon_stops_with_one_line(tmp_path: Path, signum: signal.Signals) -> None:
    with _daemons(tmp_path) as (control, node, control_err, node_err):
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
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    stderr = (tmp_path / "err").read_text()
    _assert_clean(stderr, "llmgw-node stopped")
    _assert_clean(stderr, "llmgw-control stopped")
    assert "again: stopping now" not in stderr, stderr
