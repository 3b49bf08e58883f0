"""The admin listener answers only to the names it is really reached by: a guard against DNS rebinding.

The admin listener trusts whoever can connect to it (it has no login; it stays on loopback or a
management network). A web page the operator opens can make its own name resolve to 127.0.0.1
(DNS rebinding): the browser then counts the admin listener as that page's origin, lets the page
read its answers, and sends its POSTs with an ``Origin`` that matches ``Host`` -- so the origin
guard passes, and the page could list nodes or make itself an admin key. What such a page cannot
change is the ``Host`` header, which stays its own name. So the admin listener serves a request
only when its Host is an IP address, ``localhost``, or a name listed in ``admin_hosts``.

``/metrics`` and ``/healthz`` answer to any name: Prometheus and load balancers reach them by
whatever name their config uses, and they carry nothing a rebinding page could use to act.
The client port's ``/admin`` is not behind this guard: it has its own login and CSRF checks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from ..transport.asgi import Receive, Scope, Send
from .api.core import send_error

OPEN_PATHS = frozenset({"/metrics", "/healthz"})


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port or IPv6 brackets, lower-cased."""
    host = host_header.strip()
    if host.startswith("["):
        return host[1 : host.find("]")].lower() if "]" in host else ""
    return host.rsplit(":", 1)[0].lower().rstrip(".") if host.count(":") <= 1 else host.lower()


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class AdminHostGuard:
    def __init__(self, app: Any, allowed_names: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset({"localhost", *(name.lower().rstrip(".") for name in allowed_names)})

    def allows(self, host_header: str | None) -> bool:
        if host_header is None:
            return True  # no browser sends a request without Host; nothing to rebind
        name = host_name(host_header)
        return name in self.allowed or _is_ip(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"] not in OPEN_PATHS:
            host = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"), None)
            if not self.allows(host):
                await _refuse(scope, send, host or "")
                return
        await self.app(scope, receive, send)


async def _refuse(scope: Scope, send: Send, host: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    # 421 Misdirected Request: this server is not the one for that name.
    await send_error(
        send,
        421,
        "host_not_allowed",
        f"This admin listener does not answer to the name {host_name(host)!r}. If it is one of "
        "yours, add it to admin_hosts in the control config.",
    )
