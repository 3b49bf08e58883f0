"""A throwaway PostgreSQL server for tests: initdb + pg_ctl on a temporary directory.

Debian's ``postgresql`` package provides the binaries (``/usr/lib/postgresql/<N>/bin``; CI
installs it with ``apt-get install -y postgresql``). PostgreSQL refuses to run as root, so when
we are root the server runs as the ``postgres`` user, on a directory that user owns. It listens
on 127.0.0.1 only, on a free port, with ``trust`` authentication and ``fsync=off`` (test data
need not survive a power cut, and fsync is most of the start-up and CREATE DATABASE time).

    with PostgresServer.start() as server:
        url = server.create_database("t1")   # postgresql://postgres@127.0.0.1:PORT/t1

Use one server per test session and a database per test (about 0.3 s each).
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

INSTALL_HINT = "install PostgreSQL's server binaries: apt-get update && apt-get install -y postgresql"


class PostgresUnavailable(RuntimeError):
    """The binaries are missing or the server would not start; the message says which and how."""


def find_bindir() -> Path:
    """The directory holding initdb/pg_ctl: ``$LLMGW_PG_BINDIR``, PATH, or Debian's layout."""
    env = os.environ.get("LLMGW_PG_BINDIR")
    candidates: list[Path] = [Path(env)] if env else []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(re.sub(r"\D", "", Path(p).parent.name) or 0),
        reverse=True,
    )
    candidates += [Path(p) for p in debian]
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    raise PostgresUnavailable(f"PostgreSQL server binaries (initdb, pg_ctl) not found; {INSTALL_HINT}")


def _reachable_tmp() -> str:
    """A temporary directory the ``postgres`` user can reach: $TMPDIR may sit under /root."""
    base = Path(tempfile.gettempdir()).resolve()
    for part in (base, *base.parents):
        if not os.stat(part).st_mode & 0o001:  # no search permission for others
            return "/tmp"
    return str(base)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PostgresServer:
    """A running server; ``stop()`` (or leaving the ``with`` block) shuts it down and cleans up."""

    def __init__(self, bindir: Path, root: Path, port: int, user: str | None) -> None:
        self.bindir = bindir
        self.root = root
        self.datadir = root / "data"
        self.port = port
        self.host = "127.0.0.1"
        self._user = user
        self._running = False
        self._server_version: int | None = None

    # -- life cycle ---------------------------------------------------------------------------

    @classmethod
    def start(cls, *, bindir: Path | None = None, timeout: float = 60.0) -> PostgresServer:
        bindir = bindir or find_bindir()
        if not (bindir / "initdb").is_file() or not (bindir / "pg_ctl").is_file():
            raise PostgresUnavailable(f"no initdb/pg_ctl in {bindir}; {INSTALL_HINT}")
        user = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(f"running as root but there is no 'postgres' user; {INSTALL_HINT}") from None
            user = "postgres"
        root = Path(tempfile.mkdtemp(prefix="llmgw-pg-", dir=_reachable_tmp() if user else None))
        server = cls(bindir, root, free_port(), user)
        try:
            server._init_and_start(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def _run(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self._user is not None:
            kwargs.update(user=self._user, group=self._user, extra_groups=[])
        return subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
            **kwargs,
        )

    def _init_and_start(self, timeout: float) -> None:
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        os.chmod(self.root, 0o700)
        init = self._run(
            "initdb", "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync", "-D", str(self.datadir),
            timeout=timeout,
        )  # fmt: skip
        if init.returncode != 0:
            raise PostgresUnavailable(f"initdb failed:\n{init.stdout}\n{init.stderr}")
        self._start_server(timeout)

    def _start_server(self, timeout: float) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c fsync=off -c synchronous_commit=off "
            f"-c full_page_writes=off -c unix_socket_directories={self.root} -c max_connections=200"
        )
        start = self._run(
            "pg_ctl", "-D", str(self.datadir), "-l", str(self.root / "server.log"), "-o", options,
            "-w", "-t", str(int(timeout)), "start",
            timeout=timeout + 5,
        )  # fmt: skip
        if start.returncode != 0:
            raise PostgresUnavailable(f"pg_ctl start failed:\n{start.stdout}\n{start.stderr}\n{self.log_tail()}")
        self._running = True

    def stop(self) -> None:
        """Stop the server (immediate mode: test data need no clean shutdown) and delete its directory."""
        if self._running:
            self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop", timeout=60)
            self._running = False
        shutil.rmtree(self.root, ignore_errors=True)

    def pause(self) -> None:
        """Stop the server but keep its data, to simulate an outage; ``resume()`` restarts it.

        Fast mode, not immediate: with ``synchronous_commit=off`` an immediate stop (a crash)
        may lose the last commits, which would turn an outage test into a data-loss test.
        """
        self._run("pg_ctl", "-D", str(self.datadir), "-m", "fast", "-w", "stop", timeout=60)
        self._running = False

    def resume(self, timeout: float = 60.0) -> None:
        """Start a paused server again, same port and data."""
        self._start_server(timeout)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.root / "server.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    # -- databases ----------------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{database}"

    def execute(self, sql: str, database: str = "postgres") -> None:
        """Run one statement in autocommit mode (CREATE DATABASE cannot run in a transaction)."""
        import psycopg  # imported here: the rest of this module needs only the standard library

        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(self.url(database), autocommit=True, connect_timeout=5) as conn:
                    conn.execute(sql.encode())
                return
            except psycopg.OperationalError:
                # Right after start the server may still refuse connections for a moment.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def create_database(self, name: str) -> str:
        """Create an empty database and return its URL."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise ValueError(f"database name {name!r} must be a lower-case SQL identifier")
        # FILE_COPY (PostgreSQL 15+) copies the small template in one go; the default WAL_LOG
        # strategy logs it block by block and is about twice as slow here.
        strategy = " STRATEGY FILE_COPY" if self._version() >= 150000 else ""
        self.execute(f"CREATE DATABASE {name}{strategy}")
        return self.url(name)

    def _version(self) -> int:
        if self._server_version is None:
            import psycopg

            with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
                self._server_version = conn.info.server_version
        return self._server_version

    def drop_database(self, name: str) -> None:
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise ValueError(f"database name {name!r} must be a lower-case SQL identifier")
        self.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def terminate_connections(self, database: str) -> None:
        """Cut every client connection to ``database`` (pg_terminate_backend), as a network cut would."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", database):
            raise ValueError(f"database name {database!r} must be a lower-case SQL identifier")
        self.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"
        )
