"""systemd's notify protocol (``Type=notify``), on ``trio.socket``, without libsystemd.

systemd passes ``NOTIFY_SOCKET`` (an AF_UNIX datagram socket; a leading ``@`` means the abstract
namespace) and, when the unit sets ``WatchdogSec``, ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``). A
daemon sends ``READY=1`` once it can do its job, ``STOPPING=1`` when it begins to shut down, and
``WATCHDOG=1`` more often than every ``WatchdogSec``. Outside systemd (no ``NOTIFY_SOCKET``) every
call here does nothing, so the daemons call it unconditionally.

A failed send is logged, never raised: a daemon that serves traffic must not die because the
service manager went away (``systemctl daemon-reexec``, a test that closed its socket).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import trio

from .logs import get_logger

log = get_logger(__name__)


def notify_address(environ: Mapping[str, str] | None = None) -> str | bytes | None:
    """Where to send notifications, or None when not run by systemd with ``Type=notify``."""
    env = os.environ if environ is None else environ
    path = env.get("NOTIFY_SOCKET", "")
    if not path:
        return None
    if path.startswith("@"):
        # Abstract namespace: the name starts with a NUL byte instead of the '@'.
        return b"\0" + path[1:].encode()
    if not path.startswith("/"):
        # systemd also allows vsock: addresses; the daemons never run that way, and guessing
        # would send a datagram somewhere unexpected.
        log.warning("NOTIFY_SOCKET %r is not a unix socket path: notifications disabled", path)
        return None
    return path


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` messages (half of ``WatchdogSec``), or None when no watchdog."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    # WATCHDOG_PID names the process the watchdog is meant for; a child that inherited the
    # environment (an engine, a shell) must not keep the parent's watchdog happy.
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return value / 1_000_000 / 2


async def notify(*states: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``states`` (e.g. ``"READY=1"``, ``"STATUS=..."``) as one datagram; False when not sent."""
    address = notify_address(environ)
    if address is None or not states:
        return False
    message = "\n".join(states).encode()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        with sock:
            await sock.connect(address)
            await sock.send(message)
    except OSError as exc:
        log.warning("cannot notify the service manager (%s): %s", states[0], exc)
        return False
    return True


async def ready(status: str = "", environ: Mapping[str, str] | None = None) -> bool:
    return await notify("READY=1", *([f"STATUS={status}"] if status else []), environ=environ)


async def stopping(status: str = "", environ: Mapping[str, str] | None = None) -> bool:
    return await notify("STOPPING=1", *([f"STATUS={status}"] if status else []), environ=environ)


async def status(text: str, environ: Mapping[str, str] | None = None) -> bool:
    return await notify(f"STATUS={text}", environ=environ)


async def watchdog_loop(
    environ: Mapping[str, str] | None = None, *, task_status: trio.TaskStatus[float | None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Send ``WATCHDOG=1`` every ``WatchdogSec / 2`` until cancelled; returns at once without a watchdog.

    It runs in the daemon's own nursery, so a wedged event loop stops the pings and systemd
    restarts the daemon: the point of the watchdog.
    """
    interval = watchdog_interval(environ) if notify_address(environ) is not None else None
    task_status.started(interval)
    if interval is None:
        return
    while True:
        await notify("WATCHDOG=1", environ=environ)
        await trio.sleep(interval)


async def stopping_on(shutdown: trio.Event, environ: Mapping[str, str] | None = None) -> None:
    """Send ``STOPPING=1`` as soon as ``shutdown`` is set (run as a task; cancelled with the daemon)."""
    await shutdown.wait()
    await stopping("shutting down", environ=environ)
