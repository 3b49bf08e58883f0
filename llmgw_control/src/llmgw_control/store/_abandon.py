"""Running a blocking call in a thread so that cancelling the caller returns at once.

trio cannot interrupt a thread. With ``abandon_on_cancel=True`` the awaiting task is released
immediately and the thread runs on; whatever resource the thread holds (a connection in the
middle of a transaction) must then never be reused. ``Loan`` records, under a lock, whether the
thread or the trio side ends up owning the resource, so exactly one of them disposes of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from llmgw_shared.threads import STORE

C = TypeVar("C")
T = TypeVar("T")


class Loan(Generic[C]):
    """A resource lent to one worker thread; ``dispose`` is called at most once, by the last owner."""

    def __init__(self, resource: C | None, dispose: Callable[[C], None]) -> None:
        self.resource = resource
        self._dispose = dispose
        self._lock = threading.Lock()
        self._finished = False
        self._abandoned = False

    def thread_finished(self) -> None:
        """Called by the worker thread as its last act."""
        with self._lock:
            self._finished = True
            abandoned = self._abandoned
        if abandoned and self.resource is not None:
            self._dispose(self.resource)
            self.resource = None

    def abandon(self) -> None:
        """Called by the trio side on cancellation: if the thread still runs, it disposes."""
        with self._lock:
            if not self._finished:
                self._abandoned = True

    @property
    def abandoned(self) -> bool:
        """True when the thread owns the resource; the trio side must not reuse it."""
        with self._lock:
            return self._abandoned


async def run_abandonable(loan: Loan[C], work: Callable[[Loan[C]], T]) -> T:
    """Run ``work(loan)`` in a thread; on cancellation hand the loan's resource to the thread."""

    def in_thread() -> T:
        try:
            return work(loan)
        finally:
            loan.thread_finished()

    try:
        return await STORE.run(in_thread, abandon=True)
    except BaseException:
        loan.abandon()
        raise
