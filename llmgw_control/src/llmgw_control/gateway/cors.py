"""CORS on the client listener, for browser clients of the model APIs.

Off unless ``[router] allowed_origins`` names origins (or ``*``). An allowed origin's requests get
``Access-Control-Allow-Origin`` (the origin itself, with ``Vary: Origin``; ``*`` for ``*``) and the
headers an SDK reads exposed; a preflight ``OPTIONS`` is answered 204 with the methods and the
headers asked for. Credentials are never allowed: the client API's key travels in a header the
page sets itself (``Authorization``, ``x-api-key``), never in a cookie, so a page needs none, and
with ``*`` a browser would refuse them anyway.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

# An origin as browsers send it: scheme://host[:port], nothing after.
ORIGIN = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]{1,253}$")
# A header name a preflight may ask for, as RFC 9110 tokens; more or longer ones are not echoed.
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_MAX_ASKED_HEADERS = 32
# How long a browser may reuse a preflight's answer: ten minutes, so a changed list reaches
# pages soon after a restart.
MAX_AGE = b"600"
_EXPOSED = b"x-request-id, retry-after, x-should-retry, x-llmgw-replica, x-llmgw-queued-ms, x-llmgw-overhead-ms"
_METHODS = b"GET, POST, OPTIONS"


def origin_problem(origin: str) -> str:
    """What is wrong with an entry of ``allowed_origins`` ("" when nothing is)."""
    if origin == "*" or ORIGIN.fullmatch(origin):
        return ""
    return "must be * or an origin such as https://app.example.com (scheme, host, optional port; no path)"


@attrs.frozen
class CorsPolicy:
    origins: frozenset[str]

    @classmethod
    def of(cls, allowed: Sequence[str]) -> CorsPolicy:
        return cls(frozenset(o.rstrip("/") for o in allowed))

    def allows(self, origin: str | None) -> bool:
        return origin is not None and bool(self.origins) and ("*" in self.origins or origin in self.origins)

    def headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        """The headers for an actual request from ``origin``; none when it is not allowed."""
        if not self.allows(origin):
            return []
        assert origin is not None
        if "*" in self.origins:
            return [(b"access-control-allow-origin", b"*"), (b"access-control-expose-headers", _EXPOSED)]
        return [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"vary", b"Origin"),
            (b"access-control-expose-headers", _EXPOSED),
        ]

    def preflight(self, origin: str | None, asked_headers: str | None) -> list[tuple[bytes, bytes]]:
        """The headers of a preflight's 204 for an allowed origin (the caller refuses the others)."""
        headers = self.headers(origin)
        names = [n.strip() for n in (asked_headers or "").split(",")[:_MAX_ASKED_HEADERS] if n.strip()]
        allowed = ", ".join(n for n in names if _HEADER_NAME.fullmatch(n))
        headers += [(b"access-control-allow-methods", _METHODS), (b"access-control-max-age", MAX_AGE)]
        if allowed:
            headers.append((b"access-control-allow-headers", allowed.encode("latin-1")))
        return headers
