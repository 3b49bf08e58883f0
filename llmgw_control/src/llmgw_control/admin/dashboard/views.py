"""The dashboard's pages as a Quart blueprint, mounted once per listener.

Pages are server-rendered shells (navigation, forms, the CSRF token); ``static/dashboard.js``
fills them from the admin REST API and keeps polling it. Every action the page offers goes
through that same API (``api_base``), so the dashboard can do nothing the API does not allow.

Two mounts:
- the admin listener (``prefix=""``, loopback by default): no login. The REST API on that
  listener is open to whoever can reach it, so a login in front of the pages would protect
  nothing, and it is where the first admin key is created. Browser requests that change state
  must come from the same origin (``admin_origin_guard``).
- the client port (``prefix="/admin"``): a login with an admin key, a signed session cookie, and a
  CSRF token on everything that changes state; the API is reachable only through
  ``/admin/api/v1/`` behind the same session (``client.py``).

``make_blueprint`` composes the parts, one module each: the pages (page_views.py), the login
(login_views.py, client port only) and the History page's data (history_views.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quart import Blueprint, Response, request
from quart_trio import QuartTrio

from ..audit_log import AuditLog, peer_of
from .context import Dashboard, Mount, json_error
from .history_views import add_history_view
from .login_views import add_login_views
from .page_views import add_page_views
from .session import UNSAFE_METHODS, same_origin

__all__ = ["Dashboard", "Mount", "admin_origin_guard", "make_blueprint"]

HERE = Path(__file__).parent
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


def make_blueprint(dash: Dashboard, mount: Mount) -> Blueprint:
    bp = Blueprint(
        "dashboard",
        __name__,
        template_folder=str(HERE / "templates"),
        static_folder=str(HERE / "static"),
        static_url_path="/dashboard-static",
    )
    bp.after_request(security_headers)
    if mount.login:
        add_login_views(bp, dash, mount)
    add_page_views(bp, dash, mount)
    add_history_view(bp, dash)
    return bp


async def security_headers(response: Response) -> Response:
    # No framing (a page that frames the dashboard could trick a click on Drain or Revoke), no
    # scripts but our own file, and pages (which carry the CSRF token) are never cached.
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    if response.mimetype == "text/html":
        response.headers["Cache-Control"] = "no-store"
    return response


def admin_origin_guard(app: QuartTrio, audit: AuditLog | None = None) -> None:
    """Refuse state-changing browser requests from other origins on the (credential-less) admin listener.

    The admin API there trusts whoever can connect. Without this, any web page the operator
    visits could make the browser POST to http://127.0.0.1:8081/api/v1/... (a form post needs no
    CORS preflight). Clients that are not browsers send no Origin and are unaffected.
    """

    @app.before_request
    async def guard() -> Any:
        if request.method in UNSAFE_METHODS and not same_origin(request.headers, request.scheme):
            if audit is not None:
                await audit.refused(
                    actor="anonymous",
                    peer=peer_of(request.scope),
                    action=f"{request.method} {request.path[:150]}",
                    reason="cross_origin",
                )
            return json_error(403, "A state-changing request from another site is refused.", "cross_origin")
        return None
