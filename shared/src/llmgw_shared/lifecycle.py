"""Turning SIGTERM and SIGINT into a graceful shutdown.

Neither hypercorn (run programmatically) nor trio installs handlers for SIGTERM, so without this
``systemctl stop`` would kill a daemon at once, cutting every in-flight stream. The first signal
asks for a graceful stop; a second one means the operator wants out now.
"""

from __future__ import annotations

import signal

import trio

from .logs import get_logger

log = get_logger("llmgw.lifecycle")


async def stop_on_signals(
    shutdown: trio.Event, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            name = signal.Signals(signum).name
            if shutdown.is_set():
                log.warning("%s again: stopping now", name)
                raise KeyboardInterrupt
            log.info("%s received: shutting down gracefully", name)
            shutdown.set()
