"""The admin listener's key check: off loopback, every request needs an admin key, checked on the head.

The admin listener trusts whoever can connect (no login: it was designed for loopback or a
management network). Bound to any other address, that would hand the whole admin API -- keys,
nodes, models -- to anyone who can reach the port. So when ``admin_listen`` is not a loopback
address (or ``admin_require_key`` is set), every request must carry ``Authorization: Bearer
<key>`` for a live admin key (one created with ``--admin-key``, as the dashboard login requires),
checked from the request's head, before any body is read; ``/healthz`` alone stays open, for load
balancers. The key is checked against the in-memory key table, as the gateway checks client keys,
so revoking it or taking its admin flag away ends its access at once.

With no admin key in the store the listener could never be used, so control refuses to start
and says how to make one (on loopback, with ``llmgw-control ctl keys create ... --admin-key``).
"""

from __future__ import annotations

import ipaddress
import time
from typing import TYPE_CHECKING, Any

from llmgw_shared.config import ConfigError, parse_host_port

from ..api_errors import ClientApiError, admin_error_json
from ..transport.asgi import Receive, Scope, Send
from .audit_log import ACTOR_HEADER, AuditLog, peer_of

if TYPE_CHECKING:
    from ..tenancy.state import TenancyState

OPEN_PATHS = frozenset({"/healthz"})


def is_loopback(listen: str) -> bool:
    """Whether ``host:port`` only accepts connections from this machine."""
    host, _ = parse_host_port(listen, what="admin_listen")
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: whatever it resolves to, it may not be only this machine


def key_required(listen: str, require_key: bool) -> bool:
    return require_key or not is_loopback(listen)


def refuse_without_admin_keys(listen: str, require_key: bool, state: TenancyState) -> None:
    """``ConfigError`` when the admin listener needs a key and no usable admin key exists."""
    if not key_required(listen, require_key):
        return
    now = time.time()
    keys = (state.keys.get(digest) for digest in state.keys.digests())
    if any(key is not None and key.admin and not key.revoked and not key.expired(now) for key in keys):
        return
    why = f"admin_listen {listen} is not a loopback address" if not is_loopback(listen) else "admin_require_key is set"
    raise ConfigError(
        f"{why}, so every admin request needs an admin key, and no admin key exists. Either create one first, "
        "with admin_listen on 127.0.0.1: `llmgw-control ctl keys create ops --group GROUP --admin-key` (its "
        "secret is shown once; send it as 'Authorization: Bearer <key>', or set LLMGW_ADMIN_KEY for ctl), then "
        "restart with this admin_listen; or keep admin_listen on loopback (127.0.0.1:8081) and reach the admin "
        "API through the dashboard's login at /admin on the client port."
    )


class AdminKeyGuard:
    """ASGI middleware: a live admin key in the head of every request (``required``), else 401."""

    def __init__(self, app: Any, state: TenancyState, *, required: bool, audit: AuditLog | None = None) -> None:
        self.app = app
        self.state = state
        self.required = required
        self.audit = audit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = [h for h in scope.get("headers", ()) if h[0].lower() != ACTOR_HEADER]
        if self.required and scope["path"] not in OPEN_PATHS:
            authorization = next((v.decode("latin-1") for k, v in headers if k.lower() == b"authorization"), None)
            problem, key_id = self._check(authorization)
            if problem is not None:
                if self.audit is not None:
                    await self.audit.refused(
                        actor=f"key:{key_id}" if key_id else "anonymous",
                        peer=peer_of(scope),
                        action=f"{scope.get('method', 'WS')} {scope['path'][:150]}",
                        reason="admin key missing, unknown or not an admin key",
                    )
                await _refuse(scope, send, problem)
                return
            headers.append((ACTOR_HEADER, f"key:{key_id}".encode()))
        await self.app(dict(scope, headers=headers), receive, send)

    def _check(self, authorization: str | None) -> tuple[str | None, str]:
        try:
            key = self.state.authenticate(authorization)
        except ClientApiError as exc:
            return exc.message, ""
        if not key.admin:
            return "This key is not an admin key: the admin API needs one created with --admin-key.", key.id
        return None, key.id


async def _refuse(scope: Scope, send: Send, message: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = admin_error_json(
        "admin_key_required",
        f"{message} This admin listener needs an admin key on every request: send 'Authorization: Bearer <admin key>'.",
    )
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="llmgw admin"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
