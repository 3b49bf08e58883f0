"""The client port's login: the session every other page needs, the login page (an admin key, or
single sign-on), and logging out.

Mounted only where ``Mount.login`` is set (the client port's ``/admin``): there every request but
the login page and the static files needs a valid session, and every state-changing one its
CSRF token and the same origin. The admin listener's pages have no login (views.py says why).
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
from quart import Blueprint, make_response, redirect, render_template, request

from llmgw_shared.logs import get_logger

from ...api_errors import ClientApiError
from ...store import StoreError
from ..sso.login import PENDING_COOKIE, LoginRefused, pending_from_json, pending_to_json
from .context import Dashboard, Mount, json_error
from .revocations import session_subject
from .session import (
    CSRF_HEADER,
    UNSAFE_METHODS,
    Session,
    clear_cookie_header,
    cookie_value,
    csrf_ok,
    pending_cookie,
    same_origin,
    set_cookie_header,
)

log = get_logger(__name__)
# A logout waits this long for the store to record it, then logs the browser out regardless.
LOGOUT_DEADLINE_S = 5.0


def add_login_views(bp: Blueprint, dash: Dashboard, mount: Mount) -> None:
    views = _LoginViews(dash, mount)
    bp.before_request(views.require_session)
    bp.add_url_rule("/login", view_func=views.login_form, methods=["GET"])
    bp.add_url_rule("/login", view_func=views.login, methods=["POST"])
    bp.add_url_rule("/logout", view_func=views.logout, methods=["POST"])


@attrs.frozen
class _LoginViews:
    dash: Dashboard
    mount: Mount

    async def require_session(self) -> Any:
        dash, url, prefix = self.dash, self.mount.url, self.mount.prefix
        path = request.path[len(prefix) :]
        if path.startswith("/dashboard-static/") or path == "/login":
            return None
        found = dash.session_of(request.headers)
        if found is None:
            if request.method == "GET" and not path.startswith("/dashboard/"):
                return redirect(url("login"))
            return json_error(401, "Log in with an admin key first.", "login_required")
        session, _ = found
        if request.method in UNSAFE_METHODS and not (
            same_origin(request.headers, request.scheme) and await _csrf_in_request(session)
        ):
            await dash.refused(request.scope, "csrf")
            return json_error(403, "Missing or wrong CSRF token, or a request from another site.", "csrf_failed")
        return None

    async def login_page(self, message: str = "", status: int = 200) -> Any:
        url = self.mount.url
        html = await render_template(
            "login.html", url=url, static=url("dashboard-static/"), message=message, sso=self.dash.sso is not None
        )
        return html, status

    async def login_form(self) -> Any:
        # Single sign-on shares the login page's path: ``?sso=start`` sends the browser to the
        # provider, which sends it back here with ``code`` and ``state`` (or ``error``).
        args = request.args
        if self.dash.sso is None or not ({"sso", "code", "state", "error"} & set(args)):
            return await self.login_page()
        if args.get("sso") == "start":
            return await self._sso_start()
        return await self._sso_finish()

    async def _sso_start(self) -> Any:
        dash = self.dash
        assert dash.signer is not None
        try:
            target, pending = await dash.sso.begin()
        except LoginRefused as exc:
            return await self.login_page(str(exc), 502)
        response = redirect(target)
        response.headers["set-cookie"] = pending_cookie(
            dash.signer.seal(pending_to_json(pending)),
            path=self.mount.url("login"),
            max_age=600,
            secure=request.scheme == "https",
        )
        return response

    async def _sso_finish(self) -> Any:
        dash, url, args = self.dash, self.mount.url, request.args
        assert dash.signer is not None
        secure = request.scheme == "https"
        pending_path = url("login")
        pending_text = dash.signer.unseal(cookie_value(request.headers, PENDING_COOKIE))
        pending = pending_from_json(pending_text) if pending_text else None
        try:
            if "error" in args:
                raise LoginRefused(f"The provider refused the sign-in: {args.get('error', '')[:100]}.")
            identity = await dash.sso.finish(
                code=args.get("code", ""), state=args.get("state", "")[:200], pending=pending
            )
        except LoginRefused as exc:
            log.info("dashboard single sign-on refused", extra={"reason": str(exc)})
            await dash.refused(request.scope, "sso: " + str(exc)[:150])
            refused: Any = await make_response(*(await self.login_page(str(exc), 403)))
            refused.headers["set-cookie"] = pending_cookie("", path=pending_path, max_age=0, secure=secure)
            return refused
        _, value = dash.signer.new("", user=identity.user, grants=identity.grants)
        log.info("dashboard login", extra={"user": identity.user, "role": identity.role})
        # A page that moves on by itself, rather than a redirect: the session cookie is
        # SameSite=Strict and would not be sent on a redirect chain the provider's site began.
        signed_in: Any = await make_response(
            f'<!doctype html><meta http-equiv="refresh" content="0;url={url()}">'
            f'<p>Signed in. <a href="{url()}">Continue to the dashboard</a>.</p>',
            200,
        )
        signed_in.headers.add(
            "set-cookie",
            set_cookie_header(value, path=self.mount.prefix or "/", max_age=int(dash.signer.lifetime), secure=secure),
        )
        signed_in.headers.add("set-cookie", pending_cookie("", path=pending_path, max_age=0, secure=secure))
        return signed_in

    async def login(self) -> Any:
        dash = self.dash
        if not same_origin(request.headers, request.scheme):
            return json_error(403, "A login from another site is refused.", "csrf_failed")
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
            return await self.login_page(message, status)
        assert dash.signer is not None
        _, value = dash.signer.new(key.id)
        log.info("dashboard login", extra={"key_id": key.id})
        response = redirect(self.mount.url())
        response.headers["set-cookie"] = set_cookie_header(
            value, path=self.mount.prefix or "/", max_age=int(dash.signer.lifetime), secure=request.scheme == "https"
        )
        return response

    async def logout(self) -> Any:
        # Ended on the server too: a copy of the cookie (another tab's, a stolen one) stops working.
        found = self.dash.session_of(request.headers)
        if found is not None and self.dash.revocations is not None:
            session = found[0]
            try:
                with trio.fail_after(LOGOUT_DEADLINE_S):
                    await self.dash.revocations.revoke(session_subject(session), until=session.expires_at)
            except (StoreError, trio.TooSlowError) as exc:
                # The browser forgets the cookie anyway; say what was not done.
                log.warning("a logout could not be recorded on the server: %s", exc)
        response = redirect(self.mount.url("login"))
        response.headers["set-cookie"] = clear_cookie_header(
            path=self.mount.prefix or "/", secure=request.scheme == "https"
        )
        return response


async def _csrf_in_request(session: Session) -> bool:
    """The token from the ``X-CSRF-Token`` header, or from a plain form's ``csrf`` field (log out)."""
    if csrf_ok(session, request.headers):
        return True
    if request.mimetype == "application/x-www-form-urlencoded":
        token = (await request.form).get("csrf", "")
        return csrf_ok(session, {CSRF_HEADER: token})
    return False
