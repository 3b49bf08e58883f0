"""Waiting on a condition instead of a fixed sleep: a sleep on a loaded machine ends before the thing
waited for happened (a flaky failure) or long after (a slow suite); polling ends as soon as it holds."""

from __future__ import annotations

from typing import Any

import trio

# How often the condition is checked: small against the seconds a test waits, large against a check.
POLL_S = 0.05


async def wait_until(predicate: Any, timeout: float = 10) -> None:
    """Return once ``await predicate()`` is true; TooSlowError after ``timeout`` seconds."""
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(POLL_S)
