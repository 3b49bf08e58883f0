"""Waiting on a condition instead of a fixed sleep: a sleep on a loaded machine ends before the thing
waited for happened (a flaky failure) or long after (a slow suite); polling ends as soon as it holds.

``wait_until`` is for trio code, ``wait_until_sync`` for a thread or a plain function (a Playwright
driver, a process-level check). Both return the condition's first true value, so a test that waits
for something can use what it waited for. ``tests/test_no_poll_loops.py`` keeps new hand-written
polling loops out of the suite: use these instead.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import trio

# How often the condition is checked: small against the seconds a test waits, large against a check.
POLL_S = 0.05


async def wait_until(predicate: Callable[[], Any], timeout: float = 10, interval: float = POLL_S) -> Any:
    """Return ``predicate()``'s first true value (awaited when it is a coroutine), checked every
    ``interval`` seconds; TooSlowError after ``timeout`` seconds."""
    with trio.fail_after(timeout):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await trio.sleep(interval)


def wait_until_sync(predicate: Callable[[], Any], timeout: float = 10, interval: float = POLL_S) -> Any:
    """``wait_until`` outside trio: ``predicate()``'s first true value; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the condition did not hold within {timeout} s")
        time.sleep(interval)
