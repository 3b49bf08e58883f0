"""The control daemon as a real process (``llmgw-control run``) for tests that talk to it over sockets.

Synchronous, so it serves session- or module-scoped fixtures and plain-socket tests (hypothesis
among them): the process starts once, every listener on 127.0.0.1 and a free port, and is
stopped by its pid at the end.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import httpx2

from llmgw_dev.engine_proc import free_port
from support.waiting import wait_until_sync

LLMGW_CONTROL = str(Path(sys.executable).with_name("llmgw-control"))


@attrs.define
class ControlDaemon:
    process: subprocess.Popen[bytes]
    ports: dict[str, int]
    log_path: Path
    data_dir: Path
    # A client context trusting the test CA, for the listeners in tls_listeners.
    client_ssl: ssl.SSLContext | None = None
    tls_listeners: frozenset[str] = frozenset()

    def url(self, listener: str) -> str:
        scheme = "https" if self.client_ssl is not None and listener in self.tls_listeners else "http"
        return f"{scheme}://127.0.0.1:{self.ports[listener]}"

    def connect(self, listener: str, timeout: float = 5.0) -> socket.socket:
        """A connected socket to ``listener`` (TLS-wrapped when that listener speaks TLS)."""
        sock = socket.create_connection(("127.0.0.1", self.ports[listener]), timeout=timeout)
        if self.client_ssl is not None and listener in self.tls_listeners:
            return self.client_ssl.wrap_socket(sock, server_hostname="127.0.0.1")
        return sock

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


@contextmanager
def control_daemon(
    tmp: Path,
    config: str = "",
    *,
    listeners: tuple[str, ...] = ("api", "admin"),
    agents_config: str = "",
    client_ssl: ssl.SSLContext | None = None,
    tls_listeners: frozenset[str] = frozenset(),
) -> Iterator[ControlDaemon]:
    """Run ``llmgw-control run`` with ``config`` (TOML after the listener lines) until the block ends.

    ``listeners`` names which listeners get a port: api and admin always; metrics and agents
    when asked for (``agents_config``: more lines for its section). ``client_ssl`` (a client
    context trusting the test CA) is for ``tls_listeners``.
    """
    ports = {name: free_port() for name in ("api", "admin", *listeners)}
    data_dir = tmp / "control-data"
    lines = [
        f'listen = "127.0.0.1:{ports["api"]}"',
        f'admin_listen = "127.0.0.1:{ports["admin"]}"',
        f'data_dir = "{data_dir}"',
        'log_format = "json"',
    ]
    if "metrics" in ports:
        lines.append(f'metrics_listen = "127.0.0.1:{ports["metrics"]}"')
    text = "\n".join(lines) + "\n" + config
    if "agents" in ports:
        assert "[agents]" not in config, "give the agents section through agents_config"
        text += f'\n[agents]\nlisten = "127.0.0.1:{ports["agents"]}"\n{agents_config}\n'
    path = tmp / "control.toml"
    path.write_text(text)
    log_path = tmp / "control.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([LLMGW_CONTROL, "run", "--config", str(path)], stdout=log, stderr=subprocess.STDOUT)
    daemon = ControlDaemon(process, ports, log_path, data_dir, client_ssl, tls_listeners)
    try:
        _wait_ready(daemon)
        yield daemon
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(daemon: ControlDaemon) -> None:
    verify: ssl.SSLContext | bool = daemon.client_ssl if daemon.client_ssl is not None else True
    with httpx2.Client(verify=verify, timeout=2) as client:

        def ready() -> bool:
            if daemon.process.poll() is not None:
                raise AssertionError(f"llmgw-control exited {daemon.process.returncode}:\n{daemon.log()[-3000:]}")
            try:
                return (
                    client.get(daemon.url("admin") + "/healthz").status_code == 200
                    and client.get(daemon.url("api") + "/healthz").status_code == 200
                )
            except httpx2.TransportError:
                return False

        try:
            wait_until_sync(ready, timeout=30)
        except TimeoutError:
            raise AssertionError(f"llmgw-control did not become ready:\n{daemon.log()[-3000:]}") from None
