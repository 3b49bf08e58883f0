"""Turning SIGTERM and SIGINT into a graceful shutdown.

Neither hypercorn (run programmatically) nor trio installs handlers for SIGTERM, so without this
``systemctl stop`` would kill a daemon at once, cutting every in-flight stream. The first signal
asks for a graceful stop; a second one means the operator wants out now.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import trio

from .logs import get_logger

log = get_logger(__name__)


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


@contextmanager
def signals_outside_the_loop() -> Iterator[None]:
    """Around a daemon's ``trio.run``: what SIGTERM and SIGINT do when no receiver is open.

    ``stop_on_signals`` owns both signals while the loop runs. Before it starts, and when it
    closes (a signal still pending then is redelivered under the handler it restores), a signal
    ends the daemon at once with 130, "out now". Once the loop has returned the daemon has
    stopped and said so; the interpreter's own finalisation resets Python handlers to the default,
    so a late signal would kill it by SIGTERM (exit -15, seen in tests/test_clean_stop.py): the
    signals are ignored from then on (an ignored signal stays ignored through finalisation).
    """
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _out_now)
    try:
        yield
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)


def _out_now(signum: int, frame: FrameType | None) -> None:
    sys.stderr.flush()
    os._exit(130)
