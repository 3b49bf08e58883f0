"""The dashboard's login session on the client port: a signed, expiring cookie and its CSRF token.

The cookie holds ``{"k": key id, "c": csrf token, "e": expiry}`` signed with HMAC-SHA256 under a
secret kept in the data directory (``dashboard-secret``), so sessions survive a restart and every
control daemon sharing that file accepts them. Nothing secret is in the payload: the key's
secret is never stored, only its id, and every request re-checks that key in the live key table,
so revoking the admin key (or taking its admin flag away, or its expiry) ends the session at once.

A session can also be ended on the server before it expires (a logout, or an operator ending
every session of a user): ``revocations.py`` keeps what the store says is void, which is why
the cookie carries when it was issued (``"i"``, milliseconds) and a session id derived from its
random CSRF token.

The CSRF token is random per session. Pages carry it in a ``<meta>`` tag; the dashboard's
scripts send it as ``X-CSRF-Token`` on every state-changing request, and the server compares it
in constant time with the one in the signed cookie. A foreign site can make the browser send the
cookie (if SameSite ever failed) but cannot read the page, so it cannot know the token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from llmgw_shared.jsonin import loads as json_loads

COOKIE_NAME = "llmgw_admin_session"
CSRF_HEADER = "x-csrf-token"
UNSAFE_METHODS = frozenset(("POST", "PUT", "PATCH", "DELETE"))
# A dashboard login lasts a working day (8 h), then the admin key is asked for again: the upper
# end of the absolute session timeouts OWASP's session guidance gives (4 to 8 hours).
DEFAULT_LIFETIME = 8 * 3600.0


# An OpenID Connect user's session carries the claim values that granted access (re-mapped on
# every request, so changing the mapping takes access away): at most this many, this long each,
# which keeps the cookie far below browsers' 4 KiB.
MAX_GRANTS = 16
MAX_GRANT_LEN = 100


@attrs.frozen
class Session:
    key_id: str
    csrf: str
    expires_at: float
    # A user signed in through OpenID Connect (key_id is then empty) and their granting claim values.
    user: str = ""
    grants: tuple[str, ...] = ()
    # When it was signed (Unix seconds): a revocation voids the sessions issued before it.
    issued_at: float = 0.0

    @property
    def session_id(self) -> str:
        """A name for this one session (a logout voids it), derived from its random CSRF token:
        the token itself never leaves the cookie and the page."""
        return hashlib.sha256(b"llmgw session id\0" + self.csrf.encode()).hexdigest()[:32]


class SessionSigner:
    """Makes and checks session cookie values; pure apart from the clock."""

    def __init__(
        self, secret: bytes, *, lifetime: float = DEFAULT_LIFETIME, clock: Callable[[], float] = time.time
    ) -> None:
        if len(secret) < 16:
            raise ValueError("the dashboard session secret must be at least 16 bytes")
        # Derived, so this key signs sessions and nothing else, whatever else the file is used for.
        self._key = hmac.new(secret, b"llmgw dashboard session v1", hashlib.sha256).digest()
        # A second derived key for the sign-in's pending state: neither cookie can pass for the other.
        self._other = hmac.new(secret, b"llmgw dashboard oidc pending v1", hashlib.sha256).digest()
        self.lifetime = lifetime
        self.clock = clock

    def new(self, key_id: str, *, user: str = "", grants: tuple[str, ...] = ()) -> tuple[Session, str]:
        """A fresh session for ``key_id`` (or an OpenID Connect ``user``) and the cookie value that carries it."""
        grants = tuple(g[:MAX_GRANT_LEN] for g in grants[:MAX_GRANTS])
        # Milliseconds: a login right after its user's sessions were ended is not voided by them.
        now = int(self.clock() * 1000) / 1000
        session = Session(key_id, secrets.token_urlsafe(32), now + self.lifetime, user[:200], grants, now)
        data: dict[str, Any] = {
            "k": session.key_id,
            "c": session.csrf,
            "e": int(session.expires_at),
            "i": int(now * 1000),
        }
        if session.user:
            data |= {"u": session.user, "g": list(session.grants)}
        payload = json.dumps(data, separators=(",", ":")).encode()
        body = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
        return session, f"{body}.{self._sign(body)}"

    def load(self, value: str | None) -> Session | None:
        """The session in a cookie value, or None if absent, forged, malformed or expired."""
        if not value or len(value) > 4096:
            return None
        body, dot, signature = value.rpartition(".")
        if not dot or not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            data = json_loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            grants = data.get("g", [])
            if not isinstance(grants, list) or len(grants) > MAX_GRANTS:
                return None
            expires = float(data["e"])
            # A cookie signed before sessions carried "i" was issued a lifetime before it expires.
            issued = int(data["i"]) / 1000 if "i" in data else expires - self.lifetime
            session = Session(
                str(data["k"]), str(data["c"]), expires, str(data.get("u", "")), tuple(str(g) for g in grants), issued
            )
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
            return None
        if session.expires_at <= self.clock():
            return None
        return session

    def _sign(self, body: str, key: bytes | None = None) -> str:
        mac = hmac.new(key or self._key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def seal(self, text: str) -> str:
        """``text`` signed (not encrypted) for a cookie of another purpose than the session."""
        body = base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()
        return f"{body}.{self._sign(body, self._other)}"

    def unseal(self, value: str | None) -> str | None:
        if not value or len(value) > 4096:
            return None
        body, dot, signature = value.rpartition(".")
        if not dot or not hmac.compare_digest(signature, self._sign(body, self._other)):
            return None
        try:
            return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
        except (ValueError, binascii.Error):
            return None


def cookie_value(headers: Mapping[str, str] | Any, name: str = COOKIE_NAME) -> str | None:
    """The named cookie from a ``Cookie`` header (``headers.get`` works on both ASGI and Quart headers)."""
    raw = headers.get("cookie") or ""
    for part in raw.split(";"):
        key, eq, value = part.strip().partition("=")
        if eq and key == name:
            return value
    return None


def set_cookie_header(value: str, *, path: str, max_age: int, secure: bool) -> str:
    # SameSite=Strict: the dashboard is never entered from another site's link carrying intent,
    # and Strict keeps the cookie off every cross-site request, including top-level navigations.
    parts = [f"{COOKIE_NAME}={value}", f"Path={path}", f"Max-Age={max_age}", "HttpOnly", "SameSite=Strict"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def pending_cookie(value: str, *, path: str, max_age: int, secure: bool) -> str:
    """The sign-in's pending state: SameSite=Lax, since the provider's redirect back is a
    cross-site navigation that a Strict cookie would not come back on; it grants nothing alone."""
    parts = [f"llmgw_oidc={value}", f"Path={path}", f"Max-Age={max_age}", "HttpOnly", "SameSite=Lax"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def clear_cookie_header(*, path: str, secure: bool) -> str:
    return set_cookie_header("", path=path, max_age=0, secure=secure)


def same_origin(headers: Any, scheme: str) -> bool:
    """False when a browser says the request comes from another origin.

    ``Origin`` (sent by browsers on every POST/PUT/DELETE, same-origin included) must name this
    very scheme and host; ``Sec-Fetch-Site``, when present, must say same-origin. A request with
    neither header is not from a browser's page (curl, the CLI), and has no ambient cookie to abuse.
    """
    site = headers.get("sec-fetch-site")
    if site and site not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin is None:
        return True
    host = headers.get("host") or ""
    return bool(host) and origin == f"{scheme}://{host}"


def csrf_ok(session: Session, headers: Any) -> bool:
    token = headers.get(CSRF_HEADER) or ""
    return bool(token) and hmac.compare_digest(token, session.csrf)
