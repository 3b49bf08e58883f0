"""Worker threads, one bounded pool per subsystem: a stalled subsystem cannot starve another.

trio runs blocking calls in threads (``trio.to_thread.run_sync``), all on one default limiter
of 40 unless told otherwise. A thread cannot be interrupted, so a call that blocks forever (a
Hub that accepts and never answers) keeps its token even after its caller was cancelled: 40 of
them and every other thread call in the process (the store, a secret file, shutdown's store
close) waits for ever. Each subsystem therefore runs on its own ``CapacityLimiter`` here, sized
for its work; what blocks in one pool is invisible to the others. trio's default limiter is
left to trio's own internals (DNS lookups, ``trio.open_file``).

A limiter lives in a ``RunVar``: one per ``trio.run``, so a token an abandoned thread still
holds when a run ends (tests run many) is not missing from the next run.

Use ``POOL.limiter()`` as ``trio.to_thread.run_sync(fn, *args, limiter=POOL.limiter())``, or
``POOL.run_or_busy`` where a saturated pool should refuse at once rather than queue (``Busy``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

import attrs
import trio
from trio.lowlevel import RunVar

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Busy(Exception):
    """Every thread of a pool is taken: the caller is answered now instead of queued."""

    def __init__(self, pool: str, size: int) -> None:
        super().__init__(f"all {size} {pool} threads are busy")
        self.pool = pool
        self.size = size


@attrs.frozen(eq=False)
class ThreadPool:
    """A named, bounded set of worker threads for one subsystem."""

    name: str
    size: int
    # Why this size: shown by ``describe`` (docs/security.md lists them).
    reason: str
    _var: RunVar[trio.CapacityLimiter] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_var", RunVar(f"llmgw.threads.{self.name}"))

    def limiter(self) -> trio.CapacityLimiter:
        """This run's limiter for the pool (made on first use)."""
        try:
            return self._var.get()
        except LookupError:
            limiter = trio.CapacityLimiter(self.size)
            self._var.set(limiter)
            return limiter

    async def run(self, fn: Callable[[*Ts], T], *args: *Ts, abandon: bool = False) -> T:
        """``fn(*args)`` in one of the pool's threads, waiting for a free one."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter(), abandon_on_cancel=abandon)

    async def run_or_busy(self, fn: Callable[[*Ts], T], *args: *Ts, abandon: bool = False) -> T:
        """``fn(*args)`` in one of the pool's threads; ``Busy`` at once when none is free."""
        if self.limiter().available_tokens < 1:
            raise Busy(self.name, self.size)
        return await self.run(fn, *args, abandon=abandon)


# The pools. Sizes are per process; the reason says what fills each and why that many suffices.
HUB = ThreadPool(
    "hub",
    8,
    "Hub searches and repository listings, one per operator page view; each "
    "call ends by its deadline (hub.timeout), so 8 stalled calls are the most a dead Hub holds",
)
STORE = ThreadPool(
    "store",
    16,
    "store transactions: SQLite runs one at a time and PostgreSQL's pool holds "
    "4 connections (a thread only starts once it has one), plus a LISTEN wait; the rest is "
    "room for abandoned statements being interrupted",
)
FILES = ThreadPool(
    "files",
    4,
    "hashing and reading whole model and engine files: disk- and CPU-bound, more threads than cores only slows each",
)
DISK = ThreadPool(
    "disk",
    8,
    "small filesystem work: secrets, mkdir, stat, unlink, rename, log reads; "
    "quick, but kept apart so a long hash never delays them",
)
PROC = ThreadPool("proc", 2, "node: reading /proc for memory accounting, one sweep at a time")
INSTALL = ThreadPool("install", 2, "node: unpacking engine archives and making room for downloads")
APP = ThreadPool("app", 8, "synchronous functions the web framework runs off the event loop")
GGUF = ThreadPool(
    "gguf",
    2,
    "parsing GGUF headers of models being added: CPU work of up to half a second "
    "each, two at a time, so a burst of model changes cannot take every core",
)

EXPORT = ThreadPool(
    "export",
    1,
    "trace batches sent to the OTLP collector (llmgw_shared/tracing.py), one at a time; "
    "each ends by its own deadline (tracing.export_timeout), so a hung collector holds one thread",
)

POOLS = (HUB, STORE, FILES, DISK, PROC, INSTALL, APP, GGUF, EXPORT)
