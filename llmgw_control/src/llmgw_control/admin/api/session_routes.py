"""``POST /api/v1/sessions/revoke``: end a dashboard user's sessions on every daemon (``dashboard/revocations.py``).

Sessions are signed cookies; this records, in the store and in the same transaction as its audit
row, that the user's sessions issued until now are void. The user can sign in again at once.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import attrs

from ...api_errors import AdminApiError, bad_request
from .core import Api, Call

if TYPE_CHECKING:
    from ..dashboard.revocations import SessionRevocations

# A user name as single sign-on keeps it (the login cuts it at 200 characters); no control characters.
USER_RULES = {
    "minLength": 1,
    "maxLength": 200,
    "pattern": r"^[^\x00-\x1f\x7f]+$",
    "x-pattern-message": "must not contain control characters",
}


@attrs.frozen
class RevokeSessions:
    # The signed-in user's name as the dashboard shows it (the configured user claim, e.g. email).
    user: str | None = attrs.field(
        default=None, metadata={"schema": USER_RULES, "doc": "a single sign-on user, as the dashboard names them"}
    )
    # An admin key's dashboard sessions, without revoking the key itself.
    key_id: str | None = attrs.field(
        default=None, metadata={"schema": {"minLength": 1, "maxLength": 200}, "doc": "an admin key's id"}
    )


@attrs.frozen
class SessionsRevoked:
    subject: str
    # Sessions of the subject issued before this time are void on every daemon (within seconds).
    revoked_before: datetime


def add_session_routes(api: Api, sessions: SessionRevocations | None) -> None:
    @api.route(
        "POST",
        "/sessions/revoke",
        summary="End a dashboard user's (or admin key's) sessions everywhere",
        tag="sessions",
        body=RevokeSessions,
        response=SessionsRevoked,
        errors=(503,),
    )
    async def revoke(call: Call) -> SessionsRevoked:
        body: RevokeSessions = call.body
        if (body.user is None) == (body.key_id is None):
            raise bad_request("user", "give exactly one of user and key_id")
        if sessions is None:
            raise AdminApiError(503, "not_ready", "dashboard sessions are not kept on this daemon")
        subject = f"user:{body.user}" if body.user is not None else f"key:{body.key_id}"
        cut = await sessions.revoke(subject)
        return SessionsRevoked(subject, cut)
