"""workers = N with real processes: both workers answer on the shared port, a killed worker is
restarted, SIGTERM stops every worker with one line each. Bounded loops, no fixed sleeps."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from llmgw_control.config import ControlConfig, validate
from llmgw_control.workers import offset_address, worker_config
from llmgw_shared.config import ConfigError
from support.waiting import wait_until_sync

# Left out of the quick tier (slow: real worker processes, one killed and restarted).
pytestmark = pytest.mark.slow


_DEADLINE = 120.0  # seconds a bounded wait may take on a loaded machine before the test fails


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthz_pid(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
            return int(json.load(answer)["pid"])
    except OSError:
        return None


def _wait_for(predicate, what: str):  # type: ignore[no-untyped-def]
    try:
        return wait_until_sync(predicate, timeout=_DEADLINE, interval=0.1)
    except TimeoutError:
        raise AssertionError(f"never: {what}") from None


def test_workers_is_validated() -> None:
    with pytest.raises(ConfigError, match="workers"):
        validate(ControlConfig(workers=0))
    with pytest.raises(ConfigError, match="workers"):
        validate(ControlConfig(workers=65))


def test_each_worker_gets_its_own_admin_and_agent_port() -> None:
    config = ControlConfig(workers=2, listen="127.0.0.1:8080", admin_listen="127.0.0.1:8081")
    second = worker_config(config, 1, "127.0.0.1:8080")
    assert (second.listen, second.admin_listen, second.workers) == ("127.0.0.1:8080", "127.0.0.1:8082", 1)
    assert offset_address("127.0.0.1:0", 3, what="x") == "127.0.0.1:0"
    with pytest.raises(ConfigError, match="admin_listen"):
        worker_config(ControlConfig(admin_listen="127.0.0.1:65535"), 1, "127.0.0.1:8080")


def test_supervisor_shares_the_port_restarts_a_dead_worker_and_stops_all(tmp_path: Path) -> None:
    port = _free_port()
    config = tmp_path / "control.toml"
    config.write_text(
        f'listen = "127.0.0.1:{port}"\nadmin_listen = "127.0.0.1:0"\nworkers = 2\n'
        f'data_dir = "{tmp_path / "data"}"\nshutdown_grace = 2.0\nlog_format = "text"\n'
    )
    log = tmp_path / "control.log"
    with log.open("w") as out:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "llmgw_control.cli", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(lambda: "workers serving" in log.read_text(), "the workers are ready")
        seen: set[int] = set()

        def both() -> bool:
            pid = _healthz_pid(port)
            if pid is not None:
                seen.add(pid)
            return len(seen) == 2

        _wait_for(both, "both workers answered on the shared port")
        assert supervisor.pid not in seen
        victim = min(seen)
        os.kill(victim, signal.SIGKILL)
        _wait_for(lambda: "restarting it" in log.read_text(), "the dead worker's restart is logged")

        def replaced() -> bool:
            pid = _healthz_pid(port)
            if pid is not None and pid not in seen:
                seen.add(pid)
            return len(seen) == 3

        _wait_for(replaced, "the restarted worker answers")
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=_DEADLINE) == 0
        text = log.read_text()
        assert text.count("worker 0 stopped") == 1 and text.count("worker 1 stopped") == 1, text
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
