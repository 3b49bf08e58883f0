"""The store's error types: what callers (the admin API, the daemons) can tell apart.

The admin API maps these to HTTP statuses (``InvalidInput`` → 400, ``NotFound`` → 404,
``Conflict`` → 409), so each one names the field or the object it is about. Driver exceptions
(sqlite3, psycopg) never escape the store: they are translated here so that both backends fail
the same way.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises."""


class InvalidInput(StoreError):
    """A value the caller passed is not acceptable; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(StoreError):
    """The object named does not exist."""

    def __init__(self, kind: str, key: str) -> None:
        super().__init__(f"{kind} {key!r} not found")
        self.kind = kind
        self.key = key


class Conflict(StoreError):
    """The change contradicts what is stored (a duplicate name, a group that still has children…)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SchemaTooNew(StoreError):
    """The database was migrated by a newer llmgw than this one; opening it could corrupt it."""

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"the database schema is version {found}, but this llmgw knows versions up to {known}: "
            "it was written by a newer llmgw. Upgrade llmgw, or restore a backup taken before the upgrade."
        )
        self.found = found
        self.known = known


class StoreUnavailable(StoreError):
    """The database could not be reached or the connection broke; the operation may be retried.

    When the connection broke during COMMIT the outcome is unknown; the message says so.
    """


class StoreTimeout(StoreUnavailable):
    """A statement ran into ``statement_timeout`` (or SQLite's ``busy_timeout``)."""


class StoreClosed(StoreError):
    """The store was used after ``aclose()``."""
