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
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import httpx2
from quart import Blueprint, Response, jsonify, redirect, render_template, request
from quart_trio import QuartTrio

from llmgw_shared.logs import get_logger

from ...api_errors import ClientApiError
from .history import CHARTS, CHARTS_BY_ID, RANGES, HistoryError, query_chart
from .session import (
    CSRF_HEADER,
    UNSAFE_METHODS,
    Session,
    SessionSigner,
    clear_cookie_header,
    cookie_value,
    csrf_ok,
    same_origin,
    set_cookie_header,
)

log = get_logger(__name__)
HERE = Path(__file__).parent
PAGES = (("fleet", "", "Fleet"), ("models", "models", "Models"), ("find", "find", "Find a model"),
         ("usage", "usage", "Usage"),
         ("capacity", "capacity", "Capacity"), ("keys", "keys", "Keys"), ("history", "history", "History"))
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
# How often the pages poll the API, in milliseconds.
REFRESH_MS = 3000


@attrs.define
class Dashboard:
    """What the pages read: the fleet (None in router-only mode), tenancy, the Prometheus URL."""

    fleet: Any
    tenancy: Any
    prometheus: str = ""
    signer: SessionSigner | None = None

    def session_of(self, headers: Any) -> tuple[Session, Any] | None:
        """The valid session in the request's cookie and its admin key, or None."""
        if self.signer is None:
            return None
        session = self.signer.load(cookie_value(headers))
        if session is None:
            return None
        key = self.tenancy.state.keys.by_id(session.key_id)
        # Re-checked on every request: a revoked or demoted key ends its sessions at once.
        if key is None or not key.admin or key.revoked or key.expired(time.time()):
            return None
        return session, key


@attrs.frozen
class Mount:
    prefix: str
    api_base: str
    login: bool


def make_blueprint(dash: Dashboard, mount: Mount) -> Blueprint:
    bp = Blueprint("dashboard", __name__, template_folder=str(HERE / "templates"),
                   static_folder=str(HERE / "static"), static_url_path="/dashboard-static")
    prefix = mount.prefix

    def url(path: str = "") -> str:
        return f"{prefix}/{path}"

    async def page(name: str, session: Session | None, key: Any) -> str:
        return await render_template(
            f"{name}.html", page=name, pages=PAGES, url=url, api_base=mount.api_base, login=mount.login,
            csrf=session.csrf if session else "", who=key.name if key is not None else "",
            prometheus=bool(dash.prometheus), charts=CHARTS, ranges=RANGES, refresh_ms=REFRESH_MS,
            static=url("dashboard-static/"))

    @bp.after_request
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

    if mount.login:
        @bp.before_request
        async def require_session() -> Any:
            path = request.path[len(prefix):]
            if path.startswith("/dashboard-static/") or path == "/login":
                return None
            found = dash.session_of(request.headers)
            if found is None:
                if request.method == "GET" and not path.startswith("/dashboard/"):
                    return redirect(url("login"))
                return _error(401, "Log in with an admin key first.", "login_required")
            session, _ = found
            if request.method in UNSAFE_METHODS and not (
                    same_origin(request.headers, request.scheme) and await _csrf_in_request(session)):
                return _error(403, "Missing or wrong CSRF token, or a request from another site.", "csrf_failed")
            return None

        @bp.get("/login")
        async def login_form() -> Any:
            return await render_template("login.html", url=url, static=url("dashboard-static/"), message="")

        @bp.post("/login")
        async def login() -> Any:
            if not same_origin(request.headers, request.scheme):
                return _error(403, "A login from another site is refused.", "csrf_failed")
            form = await request.form
            secret = (form.get("key") or "").strip()
            message, status = "", 200
            try:
                key = dash.tenancy.state.authenticate(f"Bearer {secret}")
            except ClientApiError as exc:
                message, status = exc.message, 401
            else:
                if not key.admin:
                    message, status = "That key is valid but not an admin key.", 403
            if message:
                # The key itself is never logged or echoed back into the page.
                log.info("dashboard login refused", extra={"status": status})
                html = await render_template("login.html", url=url, static=url("dashboard-static/"),
                                             message=message)
                return html, status
            assert dash.signer is not None
            _, value = dash.signer.new(key.id)
            log.info("dashboard login", extra={"key_id": key.id})
            response = redirect(url())
            response.headers["set-cookie"] = set_cookie_header(
                value, path=prefix or "/", max_age=int(dash.signer.lifetime), secure=request.scheme == "https")
            return response

        @bp.post("/logout")
        async def logout() -> Any:
            response = redirect(url("login"))
            response.headers["set-cookie"] = clear_cookie_header(path=prefix or "/",
                                                                 secure=request.scheme == "https")
            return response

    def found() -> tuple[Session | None, Any]:
        if not mount.login:
            return None, None
        result = dash.session_of(request.headers)
        return result if result is not None else (None, None)

    for name, path, _ in PAGES:
        def make(name: str = name) -> Any:
            async def view() -> Any:
                session, key = found()
                return await page(name, session, key)
            view.__name__ = f"page_{name}"
            return view
        bp.add_url_rule(f"/{path}", f"page_{name}", make(), methods=["GET"])

    @bp.get("/dashboard/history.json")
    async def history() -> Any:
        if not dash.prometheus:
            return _error(404, "History is off: set [monitoring] prometheus in the control config.",
                          "history_disabled")
        chart = CHARTS_BY_ID.get(request.args.get("chart", ""))
        if chart is None:
            return _error(400, f"chart must be one of {', '.join(CHARTS_BY_ID)}.", "invalid_chart", "chart")
        try:
            range_s = int(request.args.get("range", "3600"))
        except ValueError:
            range_s = -1
        if range_s not in RANGES:
            return _error(400, f"range must be one of {', '.join(map(str, RANGES))} seconds.", "invalid_range",
                          "range")
        try:
            async with httpx2.AsyncClient(timeout=10) as client:
                return jsonify(await query_chart(client, dash.prometheus, chart, range_s, now=time.time()))
        except HistoryError as exc:
            return _error(502, str(exc), "prometheus_unavailable")

    return bp


async def _csrf_in_request(session: Session) -> bool:
    """The token from the ``X-CSRF-Token`` header, or from a plain form's ``csrf`` field (log out)."""
    if csrf_ok(session, request.headers):
        return True
    if request.mimetype == "application/x-www-form-urlencoded":
        token = (await request.form).get("csrf", "")
        return csrf_ok(session, {CSRF_HEADER: token})
    return False


def _error(status: int, message: str, code: str, field: str | None = None) -> Response:
    response = jsonify({"error": {"message": message, "code": code, "field": field}})
    response.status_code = status
    return response


def admin_origin_guard(app: QuartTrio) -> None:
    """Refuse state-changing browser requests from other origins on the (credential-less) admin listener.

    The admin API there trusts whoever can connect. Without this, any web page the operator
    visits could make the browser POST to http://127.0.0.1:8081/api/v1/... (a form post needs no
    CORS preflight). Clients that are not browsers send no Origin and are unaffected.
    """
    @app.before_request
    async def guard() -> Any:
        if request.method in UNSAFE_METHODS and not same_origin(request.headers, request.scheme):
            return _error(403, "A state-changing request from another site is refused.", "cross_origin")
        return None
