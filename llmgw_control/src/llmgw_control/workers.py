"""``workers = N``: one supervisor process and N gateway processes on one machine.

Each worker is a whole control daemon on the same config and store (``llmgw-control run`` again,
with ``--worker I``): the leader lease picks one of them to talk to nodes, as it picks one of
several daemons. They share the client port through ``SO_REUSEPORT`` (the kernel spreads new
connections over their listening sockets); the admin, metrics and agent listeners are per
worker, at the configured port plus the worker's index, because each of those must reach one
exact process: Prometheus scrapes every worker's own counters, and the lease advertises the
leader's agent URL, which nodes redirected by a standby must reach. Quotas hold for all the
workers together, as for several daemons: each worker leases its parts of every limit from the
store (tenancy/slices.py; ``tenancy.quotas_shared`` counts a worker as one of several daemons).

The supervisor holds no request state. It prepares what the workers would race for (a SQLite
store's migrations and the stale lease of a previous run, the secrets files), keeps the client
port reserved (a bound, never listening socket, so a port 0 is chosen once and no other program
takes the port while workers restart), restarts a worker that dies (bounded backoff, one log line),
relays SIGTERM/SIGINT/SIGHUP to every worker (each drains gracefully; a second signal is their
"stop now"), and exits once all have stopped. Workers run in their own process group, so a
terminal's Ctrl-C reaches them once, through the supervisor, not twice; a worker whose
supervisor vanished stops by itself (``watch_supervisor``).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import attrs
import trio

from llmgw_shared import sdnotify
from llmgw_shared.config import ConfigError, parse_host_port
from llmgw_shared.logs import get_logger
from llmgw_shared.threads import DISK

from .config import ControlConfig

log = get_logger(__name__)

# A worker that dies is restarted after this long, doubling up to the cap: a crash loop (a
# database down) costs a few processes a minute, not a fork storm; one that had served this long
# before dying starts again from the shortest delay.
_FIRST_BACKOFF = 0.5
_MAX_BACKOFF = 30.0
_HEALTHY_AFTER = 60.0
# After the drain a worker was given (shutdown_grace) and this margin, it is killed: systemd's
# own stop timeout must not be what ends a wedged worker.
_KILL_MARGIN = 10.0
# How often a worker checks that its supervisor is still there.
_PARENT_POLL_SECONDS = 1.0
# systemd talks to the supervisor alone (NotifyAccess=main): a worker must not send READY=1.
_SUPERVISOR_ONLY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def offset_address(address: str, index: int, *, what: str) -> str:
    """``host:port`` with the port moved up by ``index`` (port 0 stays 0: each worker gets its own)."""
    if not address:
        return address
    host, port = parse_host_port(address, what=what)
    if port == 0:
        return address
    if port + index > 65535:
        raise ConfigError(f"{what}: port {port} + worker index {index} is beyond 65535; lower the port or workers")
    return f"{host}:{port + index}" if ":" not in host else f"[{host}]:{port + index}"


def worker_config(config: ControlConfig, index: int, listen: str) -> ControlConfig:
    """What worker ``index`` runs: the shared client address, its own admin, metrics and agent ports."""
    return attrs.evolve(
        config,
        workers=1,
        listen=listen,
        admin_listen=offset_address(config.admin_listen, index, what="admin_listen"),
        metrics_listen=offset_address(config.metrics_listen, index, what="metrics_listen"),
        agents=attrs.evolve(config.agents, listen=offset_address(config.agents.listen, index, what="agents.listen")),
    )


def check_worker_ports(config: ControlConfig) -> None:
    """Every worker's ports exist (refused at start, with the option's name, not by a crashing worker)."""
    for index in range(config.workers):
        worker_config(config, index, config.listen)


def reserve_client_port(listen: str) -> socket.socket:
    """A bound ``SO_REUSEPORT`` socket that never listens: the port every worker binds too.

    Only listening sockets get connections, so this one takes none; it fixes the port (0 is
    chosen here, once) and keeps it ours while every worker restarts.
    """
    from .transport.serving import bind

    sockets = bind(listen, reuse_port=True)
    for extra in sockets[1:]:
        extra.close()
    return sockets[0]


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def prepare_shared_state(config: ControlConfig, data_dir: Path) -> None:
    """What workers starting at once would race for, done once: a SQLite store's migrations, the
    stale lease of a previous run (cleared here, never by a worker, since a restarted worker would
    clear its live leader's lease), and the secrets files."""
    from .fleet.leadership import clear_single_daemon_lease
    from .fleet.secret import load_or_create_secret
    from .store import is_postgres_url, open_store
    from .tenancy.keys import load_or_create_server_secret

    location = config.store or str(data_dir / "llmgw.db")
    if is_postgres_url(location):
        return  # several daemons share it already: nothing of it belongs to this machine alone
    await DISK.run(partial(data_dir.mkdir, parents=True, exist_ok=True))
    await DISK.run(load_or_create_server_secret, data_dir / "key-secret")
    if config.agents.listen:
        await DISK.run(load_or_create_secret, data_dir)
    async with open_store(location) as store:
        await clear_single_daemon_lease(store.lease)


@attrs.define
class _Worker:
    index: int
    process: trio.Process | None = None
    ever_ready: bool = False


class WorkerSupervisor:
    """Runs ``config.workers`` workers until a signal (relayed to them) and their exit."""

    def __init__(self, config: ControlConfig, argv: Sequence[str], listen: str) -> None:
        self.config = config
        self.argv = list(argv)
        self.listen = listen
        self.workers = [_Worker(index) for index in range(config.workers)]
        self.stopping = False
        self._stopped = trio.Event()
        self.failed_to_start = False
        self._ready = 0
        self._all_ready = trio.Event()

    def command(self, index: int, ready_fd: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "llmgw_control.cli",
            *self.argv,
            "--worker",
            str(index),
            "--worker-listen",
            self.listen,
            "--worker-ready-fd",
            str(ready_fd),
        ]

    async def run(self) -> int:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._relay_signals)
            nursery.start_soon(sdnotify.watchdog_loop)
            async with trio.open_nursery() as keepers:
                for worker in self.workers:
                    keepers.start_soon(self._keep, worker)
                await self._all_ready.wait()
                if not self.stopping:
                    url = f"http://{self.listen}"
                    log.info(
                        "%d workers serving on %s",
                        len(self.workers),
                        url,
                        extra={"pids": [w.process.pid for w in self.workers if w.process], "api": url},
                    )
                    await sdnotify.ready(f"{len(self.workers)} workers serving on {url}")
            # Every keeper returned: every worker has stopped.
            nursery.cancel_scope.cancel()
        log.info("llmgw-control stopped (%d workers)", len(self.workers))
        return 1 if self.failed_to_start else 0

    def _stop_all(self, signum: int) -> None:
        self.stopping = True
        self._stopped.set()
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signum)
        # Nobody waits for readiness any more.
        self._all_ready.set()

    async def _relay_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP:
                    log.info("SIGHUP received: relayed to every worker")
                    for worker in self.workers:
                        if worker.process is not None and worker.process.returncode is None:
                            worker.process.send_signal(signal.SIGHUP)
                    continue
                log.info(
                    "%s received: stopping every worker gracefully%s",
                    name,
                    " (again: they stop now)" if self.stopping else "",
                )
                await sdnotify.stopping()
                # SIGTERM to each, even for SIGINT: a worker's first SIGTERM drains, its second stops it now.
                self._stop_all(signal.SIGTERM)

    async def _keep(self, worker: _Worker) -> None:
        backoff = _FIRST_BACKOFF
        while not self.stopping:
            started = trio.current_time()
            status = await self._run_once(worker)
            if self.stopping:
                log.info(
                    "worker %d stopped (exit status %s)",
                    worker.index,
                    status,
                    extra={"worker": worker.index, "status": status},
                )
                return
            if not worker.ever_ready:
                # Its first start failed (a config error, a port in use): restarting would hide it.
                log.error(
                    "worker %d exited with status %s before it was ready: stopping",
                    worker.index,
                    status,
                    extra={"worker": worker.index, "status": status},
                )
                self.failed_to_start = True
                self._stop_all(signal.SIGTERM)
                return
            if trio.current_time() - started >= _HEALTHY_AFTER:
                backoff = _FIRST_BACKOFF
            log.warning(
                "worker %d exited with status %s: restarting it in %.1f s",
                worker.index,
                status,
                backoff,
                extra={"worker": worker.index, "status": status},
            )
            with trio.move_on_after(backoff):
                await self._stopped.wait()  # (a shutdown during the backoff ends it)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    async def _run_once(self, worker: _Worker) -> int | str:
        """Start the worker, wait for its exit; its exit status (or the signal that ended it)."""
        read_fd, write_fd = os.pipe()
        env = {name: value for name, value in os.environ.items() if name not in _SUPERVISOR_ONLY_ENV}
        try:
            process = await trio.lowlevel.open_process(
                self.command(worker.index, write_fd), env=env, pass_fds=(write_fd,), process_group=0
            )
        finally:
            os.close(write_fd)
        worker.process = process
        log.info(
            "worker %d started (pid %d)", worker.index, process.pid, extra={"worker": worker.index, "pid": process.pid}
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._await_ready, worker, read_fd)
                status = await self._wait(process)
                nursery.cancel_scope.cancel()
            return status
        finally:
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                    await process.wait()

    async def _await_ready(self, worker: _Worker, read_fd: int) -> None:
        async with trio.lowlevel.FdStream(read_fd) as ready_pipe:
            # A line once it serves; end of file when it exited first.
            if await ready_pipe.receive_some(64) and not worker.ever_ready:
                worker.ever_ready = True
                self._ready += 1
                if self._ready == len(self.workers):
                    self._all_ready.set()

    async def _wait(self, process: trio.Process) -> int | str:
        """Its exit; killed once it outlived a shutdown's drain (shutdown_grace) by _KILL_MARGIN."""
        kill_at: float | None = None
        while process.returncode is None:
            if self.stopping and kill_at is None:
                kill_at = trio.current_time() + self.config.shutdown_grace + _KILL_MARGIN
            if kill_at is not None and trio.current_time() >= kill_at:
                log.error(
                    "worker pid %d did not stop within shutdown_grace + %.0f s: killed", process.pid, _KILL_MARGIN
                )
                process.kill()
            # Woken now and then to notice a shutdown that began meanwhile.
            with trio.move_on_after(0.5):
                await process.wait()
        code = process.returncode
        return code if code >= 0 else signal.Signals(-code).name


async def watch_supervisor(shutdown: trio.Event) -> None:
    """In a worker: stop gracefully if the supervisor is gone (it was killed: nobody would stop us)."""
    parent = os.getppid()
    while not shutdown.is_set():
        await trio.sleep(_PARENT_POLL_SECONDS)
        if os.getppid() != parent:
            log.warning("the supervisor (pid %d) is gone: this worker stops", parent)
            shutdown.set()


def announce_ready(fd: int) -> None:
    """In a worker: tell the supervisor this worker serves."""
    try:
        os.write(fd, b"ready\n")
    finally:
        os.close(fd)
