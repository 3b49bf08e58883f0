"""The seam between the shared SQL and a driver: run a function in a transaction, in a thread.

Everything above this module (the queries in ``ops_*``, the migrations, the lease) is written once
in the SQL both databases accept, with ``?`` placeholders and ``now_us()`` for "the database's
clock in microseconds". A backend translates that, runs the function in a worker thread (both
drivers block) inside one transaction, commits, and turns driver exceptions into ``errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

Row = tuple[Any, ...]


class Tx(Protocol):
    """One open transaction, used only from the worker thread that runs the function."""

    dialect: str  # "sqlite" or "postgresql", for the rare statement that differs

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        """Run a statement and return all its rows."""
        ...

    def one(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        """Run a statement and return its first row, or None."""
        ...

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run a statement and return the number of rows it changed."""
        ...


class Backend(Protocol):
    dialect: str

    async def run(self, fn: Callable[[Tx], T], *, write: bool) -> T:
        """Run ``fn`` in one transaction in a worker thread; commit if it returns, else roll back.

        Cancellation returns at once (the thread is abandoned and its connection is thrown away
        when it finishes), so a hung database cannot hold a trio deadline hostage; the abandoned
        statement may still commit.
        """
        ...

    async def aclose(self) -> None: ...
