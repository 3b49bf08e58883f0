"""What the dashboard's views share: the ``Dashboard`` (what the pages read, whose session a request
carries), the ``Mount`` the pages are served under, and the API-shaped error they answer with.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
from quart import Response, jsonify

from ..audit_log import AuditLog, peer_of
from .revocations import SessionRevocations
from .session import Session, SessionSigner, cookie_value


@attrs.frozen
class Operator:
    """Who a dashboard session belongs to: a name to show, the audit log's actor, and whether they may write."""

    name: str
    actor: str
    admin: bool


@attrs.define
class Dashboard:
    """What the pages read: the fleet (None in gateway-only mode), tenancy, the Prometheus URL."""

    fleet: Any
    tenancy: Any
    prometheus: str = ""
    signer: SessionSigner | None = None
    audit: AuditLog | None = None
    # Single sign-on (admin/sso): maps a session's claim values to access; None: admin keys only.
    sso: Any = None
    # Sessions ended on the server (a logout, an operator ending a user's sessions); None: none kept.
    revocations: SessionRevocations | None = None

    def session_of(self, headers: Any) -> tuple[Session, Operator] | None:
        """The valid session in the request's cookie and who it is, or None."""
        found = self._session_of(headers)
        if found is not None and self.revocations is not None and self.revocations.voids(found[0], found[1].actor):
            return None
        return found

    def _session_of(self, headers: Any) -> tuple[Session, Operator] | None:
        if self.signer is None:
            return None
        session = self.signer.load(cookie_value(headers))
        if session is None:
            return None
        if session.user:
            # Mapped again on every request: a mapping changed (or single sign-on turned off) ends
            # the access it no longer grants.
            role = self.sso.role_of(session.grants) if self.sso is not None else None
            if role is None:
                return None
            return session, Operator(session.user, f"user:{session.user}", role == "admin")
        key = self.tenancy.state.keys.by_id(session.key_id)
        # Re-checked on every request: a revoked or demoted key ends its sessions at once.
        if key is None or not key.admin or key.revoked or key.expired(time.time()):
            return None
        return session, Operator(key.name, f"key:{key.id}", True)

    async def refused(self, scope: Any, reason: str) -> None:
        if self.audit is not None:
            found = self.session_of(_ScopeHeaders(scope)) if isinstance(scope, dict) else None
            await self.audit.refused(
                actor=found[1].actor if found else "anonymous",
                peer=peer_of(scope),
                action=f"{scope.get('method', '')} {str(scope.get('path', ''))[:150]}",
                reason=reason,
            )


class _ScopeHeaders:
    def __init__(self, scope: dict[str, Any]) -> None:
        self._items = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._items.get(name, default)


@attrs.frozen
class Mount:
    """Where one copy of the pages is mounted: the admin listener (``""``) or the client port (``/admin``)."""

    prefix: str
    api_base: str
    login: bool

    def url(self, path: str = "") -> str:
        """A page's URL under this mount (the templates build every link with it)."""
        return f"{self.prefix}/{path}"


def json_error(status: int, message: str, code: str, field: str | None = None) -> Response:
    """An error as the admin API words it, for the dashboard's own JSON paths and refusals."""
    response = jsonify({"error": {"message": message, "code": code, "field": field}})
    response.status_code = status
    return response
