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
import trio
from quart import Blueprint, Response, jsonify, make_response, redirect, render_template, request
from quart_trio import QuartTrio

from llmgw_shared.logs import get_logger

from ...api_errors import ClientApiError
from ...store import StoreError
from ..audit_log import AuditLog, peer_of
from ..sso.login import PENDING_COOKIE, LoginRefused, pending_from_json, pending_to_json
from .history import CHARTS, CHARTS_BY_ID, RANGES, HistoryError, query_chart
from .revocations import SessionRevocations, session_subject
from .session import (
    CSRF_HEADER,
    UNSAFE_METHODS,
    Session,
    SessionSigner,
    clear_cookie_header,
    cookie_value,
    csrf_ok,
    pending_cookie,
    same_origin,
    set_cookie_header,
)

log = get_logger(__name__)
HERE = Path(__file__).parent
PAGES = (("fleet", "", "Fleet"), ("models", "models", "Models"), ("find", "find", "Find a model"),
         ("usage", "usage", "Usage"),
         ("capacity", "capacity", "Capacity"), ("keys", "keys", "Keys"), ("history", "history", "History"),
         ("audit", "audit", "Audit"))
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
# How often the pages poll the API, in milliseconds.
REFRESH_MS = 3000
# A logout waits this long for the store to record it, then logs the browser out regardless.
LOGOUT_DEADLINE_S = 5.0


@attrs.frozen
class Operator:
    """Who a dashboard session belongs to: a name to show, the audit log's actor, and whether they may write."""

    name: str
    actor: str
    admin: bool


@attrs.define
class Dashboard:
    """What the pages read: the fleet (None in router-only mode), tenancy, the Prometheus URL."""

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
            await self.audit.refused(actor=found[1].actor if found else "anonymous", peer=peer_of(scope),
                                     action=f"{scope.get('method', '')} {str(scope.get('path', ''))[:150]}",
                                     reason=reason)


class _ScopeHeaders:
    def __init__(self, scope: dict[str, Any]) -> None:
        self._items = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._items.get(name, default)


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
            read_only=key is not None and not key.admin,
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
                await dash.refused(request.scope, "csrf")
                return _error(403, "Missing or wrong CSRF token, or a request from another site.", "csrf_failed")
            return None

        async def login_page(message: str = "", status: int = 200) -> Any:
            html = await render_template("login.html", url=url, static=url("dashboard-static/"), message=message,
                                         sso=dash.sso is not None)
            return html, status

        @bp.get("/login")
        async def login_form() -> Any:
            # Single sign-on shares the login page's path: ``?sso=start`` sends the browser to the
            # provider, which sends it back here with ``code`` and ``state`` (or ``error``).
            args = request.args
            if dash.sso is None or not ({"sso", "code", "state", "error"} & set(args)):
                return await login_page()
            assert dash.signer is not None
            secure = request.scheme == "https"
            pending_path = url("login")
            if args.get("sso") == "start":
                try:
                    target, pending = await dash.sso.begin()
                except LoginRefused as exc:
                    return await login_page(str(exc), 502)
                response = redirect(target)
                response.headers["set-cookie"] = pending_cookie(
                    dash.signer.seal(pending_to_json(pending)), path=pending_path, max_age=600, secure=secure)
                return response
            pending_text = dash.signer.unseal(cookie_value(request.headers, PENDING_COOKIE))
            pending = pending_from_json(pending_text) if pending_text else None
            try:
                if "error" in args:
                    raise LoginRefused(f"The provider refused the sign-in: {args.get('error', '')[:100]}.")
                identity = await dash.sso.finish(code=args.get("code", ""), state=args.get("state", "")[:200],
                                                 pending=pending)
            except LoginRefused as exc:
                log.info("dashboard single sign-on refused", extra={"reason": str(exc)})
                await dash.refused(request.scope, "sso: " + str(exc)[:150])
                refused: Any = await make_response(*(await login_page(str(exc), 403)))
                refused.headers["set-cookie"] = pending_cookie("", path=pending_path, max_age=0, secure=secure)
                return refused
            _, value = dash.signer.new("", user=identity.user, grants=identity.grants)
            log.info("dashboard login", extra={"user": identity.user, "role": identity.role})
            # A page that moves on by itself, rather than a redirect: the session cookie is
            # SameSite=Strict and would not be sent on a redirect chain the provider's site began.
            signed_in: Any = await make_response(
                f'<!doctype html><meta http-equiv="refresh" content="0;url={url()}">'
                f'<p>Signed in. <a href="{url()}">Continue to the dashboard</a>.</p>', 200)
            signed_in.headers.add("set-cookie", set_cookie_header(
                value, path=prefix or "/", max_age=int(dash.signer.lifetime), secure=secure))
            signed_in.headers.add("set-cookie", pending_cookie("", path=pending_path, max_age=0, secure=secure))
            return signed_in

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
                # The key itself is never logged, recorded or echoed back into the page.
                log.info("dashboard login refused", extra={"status": status})
                await dash.refused(request.scope, "login: not an admin key" if status == 403 else "login: no such key")
                return await login_page(message, status)
            assert dash.signer is not None
            _, value = dash.signer.new(key.id)
            log.info("dashboard login", extra={"key_id": key.id})
            response = redirect(url())
            response.headers["set-cookie"] = set_cookie_header(
                value, path=prefix or "/", max_age=int(dash.signer.lifetime), secure=request.scheme == "https")
            return response

        @bp.post("/logout")
        async def logout() -> Any:
            # Ended on the server too: a copy of the cookie (another tab's, a stolen one) stops working.
            found = dash.session_of(request.headers)
            if found is not None and dash.revocations is not None:
                session = found[0]
                try:
                    with trio.fail_after(LOGOUT_DEADLINE_S):
                        await dash.revocations.revoke(session_subject(session), until=session.expires_at)
                except (StoreError, trio.TooSlowError) as exc:
                    # The browser forgets the cookie anyway; say what was not done.
                    log.warning("a logout could not be recorded on the server: %s", exc)
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
                await audit.refused(actor="anonymous", peer=peer_of(request.scope),
                                    action=f"{request.method} {request.path[:150]}", reason="cross_origin")
            return _error(403, "A state-changing request from another site is refused.", "cross_origin")
        return None
