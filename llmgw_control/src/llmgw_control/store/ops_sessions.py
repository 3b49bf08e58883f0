"""Dashboard sessions ended on the server (``session_revocations``, migration 10).

A dashboard session is a signed cookie (``admin/dashboard/session.py``): nothing about it is
stored, so ending one before it expires needs a record that it is void. A row for
``user:<name>`` (or ``key:<id>``) voids every session of that operator issued before
``revoked_before``; a row for ``session:<id>`` voids that one session (a logout). A row is
useless once every session it could void has expired (``expires_at``), and is deleted then, by
the next revocation's own transaction: the table holds at most a session lifetime's worth.

An operator's revocation is an admin change: made inside the request's audit scope, its row
and the audit row commit together (``OpsBase._write``).
"""

from __future__ import annotations

from datetime import datetime

from . import convert as cv
from .audit_scope import note_change
from .backend import Tx
from .errors import InvalidInput
from .ops_base import OpsBase

# ``user:`` + a user name (the login keeps 200 characters of it), ``key:`` + an id, ``session:`` + an id.
MAX_SUBJECT = 220
SUBJECT_KINDS = ("user:", "key:", "session:")


def _subject(value: str) -> str:
    if not isinstance(value, str) or not value.startswith(SUBJECT_KINDS) or len(value) > MAX_SUBJECT:
        raise InvalidInput("subject", "must be user:<name>, key:<id> or session:<id>, at most 220 characters")
    if value.partition(":")[2] == "" or any(ord(c) < 0x20 for c in value):
        raise InvalidInput("subject", "must name someone, without control characters")
    return value


class SessionOps(OpsBase):
    async def revoke_sessions(self, subject: str, *, before: datetime, until: datetime) -> datetime:
        """Void ``subject``'s sessions issued before ``before``; the row lasts until ``until``.

        A later revocation of the same subject only moves ``before`` forward. Returns the
        ``before`` in force afterwards.
        """
        subject = _subject(subject)
        cut, end = cv.to_us("before", before), cv.to_us("until", until)

        def revoke(tx: Tx) -> int:
            # Rows past their use go first, in the same transaction (the table stays small).
            tx.run("DELETE FROM session_revocations WHERE expires_at < ?", (cut,))
            row = tx.one("SELECT revoked_before, expires_at FROM session_revocations WHERE subject = ?", (subject,))
            if row is None:
                tx.run(
                    "INSERT INTO session_revocations (subject, revoked_before, expires_at) VALUES (?, ?, ?)",
                    (subject, cut, end),
                )
                note_change("session", subject, None, {"revoked_before": cv.from_us(cut)})
                return cut
            kept, old_end = max(int(row[0]), cut), max(int(row[1]), end)
            tx.run(
                "UPDATE session_revocations SET revoked_before = ?, expires_at = ? WHERE subject = ?",
                (kept, old_end, subject),
            )
            note_change(
                "session", subject, {"revoked_before": cv.from_us(int(row[0]))}, {"revoked_before": cv.from_us(kept)}
            )
            return kept

        return cv.from_us(await self._write(revoke))

    async def session_revocations(self, now: datetime) -> dict[str, datetime]:
        """Every revocation still in use at ``now``: subject → sessions issued before it are void."""
        at = cv.to_us("now", now)

        def read(tx: Tx) -> dict[str, datetime]:
            rows = tx.rows("SELECT subject, revoked_before FROM session_revocations WHERE expires_at >= ?", (at,))
            return {str(r[0]): cv.from_us(int(r[1])) for r in rows}

        return await self._read(read)
