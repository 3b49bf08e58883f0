"""The dashboard on the client port: ``/admin`` pages and ``/admin/api/v1/`` behind the admin login.

The admin REST API is served in-process by the admin listener's own app: a request to
``/admin/api/v1/<rest>`` is checked here (a valid session of a live admin key; for anything that
changes state, the CSRF token and the origin) and then handed to that app as ``/api/v1/<rest>``.
So the API exists once, and the client port reaches it only through the login; everything else
under ``/admin`` is the dashboard's pages. Other paths go to ``otherwise`` (the gateway).
"""

from __future__ import annotations

from typing import Any

from ..api.core import send_error
from ..audit_log import ACTOR_HEADER
from .context import Dashboard
from .session import UNSAFE_METHODS, csrf_ok, same_origin

PREFIX = "/admin"
API_PREFIX = "/admin/api/"
LOGIN = "/admin/login"


class _Headers:
    """Read access to ASGI headers by lower-case name (the subset ``session`` helpers use)."""

    def __init__(self, scope: dict[str, Any]) -> None:
        self._items: dict[str, str] = {}
        for name, value in scope.get("headers", ()):
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            # Cookie headers may repeat (HTTP/2); join them the way a single header would read.
            self._items[key] = f"{self._items[key]}; {text}" if key == "cookie" and key in self._items else text

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._items.get(name, default)


class ClientDashboard:
    def __init__(self, dash: Dashboard, pages: Any, admin_api: Any = None, *, otherwise: Any = None) -> None:
        self.dash = dash
        self.pages = pages
        # Paths outside /admin (the gateway answers them as before, in the OpenAI error shape).
        self.otherwise = otherwise
        # Set once the admin app exists (it is built after the client listener starts).
        self.admin_api = admin_api

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        path: str = scope["path"]
        if path.startswith(API_PREFIX):
            await self._api(scope, receive, send)
        elif path == PREFIX or path.startswith(PREFIX + "/"):
            if scope["method"] in UNSAFE_METHODS and path != LOGIN and self.dash.session_of(_Headers(scope)) is None:
                # Refused on the head, as the API above is: Quart would start reading the body
                # (and invite it with 100 Continue) before the pages' own session check runs.
                await send_error(send, 401, "login_required", "Log in to the dashboard with an admin key first.")
                return
            await self.pages(scope, receive, send)
        elif self.otherwise is not None:
            await self.otherwise(scope, receive, send)
        else:
            await send_error(send, 404, "not_found", "Not found.")

    async def _api(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = _Headers(scope)
        found = self.dash.session_of(headers)
        if found is None:
            await send_error(send, 401, "login_required", "Log in to the dashboard with an admin key first.")
            return
        session, operator = found
        if self.admin_api is None:
            await send_error(send, 503, "starting", "The admin API is starting; retry in a moment.")
            return
        if scope["method"] in UNSAFE_METHODS and not (
            same_origin(headers, scope.get("scheme", "http")) and csrf_ok(session, headers)
        ):
            await self.dash.refused(scope, "csrf")
            await send_error(send, 403, "csrf_failed", "Missing or wrong CSRF token, or a request from another site.")
            return
        if scope["method"] in UNSAFE_METHODS and not operator.admin:
            await self.dash.refused(scope, "read_only")
            await send_error(send, 403, "read_only", "Your sign-in grants read-only access: changes are refused.")
            return
        inner = scope["path"][len(PREFIX) :]
        forwarded = dict(scope, path=inner, raw_path=inner.encode("latin-1"), root_path="")
        # The admin API may record who acted; the session's key is the operator.
        # (Any copy the browser sent is dropped: only this code may say who the operator is.)
        forwarded["headers"] = [
            *(h for h in scope.get("headers", ()) if h[0].lower() != ACTOR_HEADER),
            (ACTOR_HEADER, operator.actor.encode()),
        ]
        await self.admin_api(forwarded, receive, send)
