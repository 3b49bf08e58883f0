"""The dashboard's login, session cookie and CSRF checks, against the daemon in-process (no browser).

The client port must never expose the admin API without an admin login; these tests drive the
HTTP exchanges a browser would make and a few an attacker would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx2
import pytest

from llmgw_control.admin.dashboard.session import COOKIE_NAME, SessionSigner
from support.gateway import RunningGateway, running_gateway


@attrs.frozen
class Keys:
    admin: str
    admin_id: str
    user: str
    group_id: str


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with running_gateway() as gw:
        yield gw


async def make_keys(gw: RunningGateway) -> Keys:
    async with httpx2.AsyncClient(base_url=gw.listening.admin_url) as admin:
        group = (await admin.post("/api/v1/groups", json={"name": "ops"})).json()["group"]
        made = (await admin.post("/api/v1/keys", json={"name": "root", "group_id": group["id"], "admin": True})).json()
        user = (await admin.post("/api/v1/keys", json={"name": "app", "group_id": group["id"]})).json()
    await gw.tenancy.state.refresh()
    return Keys(made["secret"], made["key"]["id"], user["secret"], group["id"])


def client(gw: RunningGateway) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(base_url=gw.url, follow_redirects=False, timeout=10)


async def login(c: httpx2.AsyncClient, key: str, *, origin: str | None = None) -> httpx2.Response:
    headers = {"origin": origin} if origin else {}
    return await c.post("/admin/login", data={"key": key}, headers=headers)


def csrf_of(html: str) -> str:
    marker = '<meta name="csrf-token" content="'
    start = html.index(marker) + len(marker)
    return html[start : html.index('"', start)]


async def test_without_a_session_pages_redirect_to_login_and_the_api_is_closed(gw: RunningGateway) -> None:
    await make_keys(gw)
    async with client(gw) as c:
        page = await c.get("/admin/")
        assert page.status_code in (302, 303) and page.headers["location"].endswith("/admin/login")
        assert (await c.get("/admin/login")).status_code == 200
        for method, path in (
            ("GET", "/admin/api/v1/keys"),
            ("GET", "/admin/api/v1/nodes"),
            ("POST", "/admin/api/v1/groups"),
            ("GET", "/admin/dashboard/history.json"),
        ):
            response = await c.request(method, path)
            assert response.status_code == 401, path
        # The raw admin API is not on the client port at all.
        assert (await c.get("/api/v1/keys")).status_code == 404
        # The OpenAI paths still go to the gateway.
        assert (await c.get("/v1/models")).status_code in (200, 401)


async def test_a_non_admin_key_and_a_wrong_key_are_refused(gw: RunningGateway) -> None:
    keys = await make_keys(gw)
    async with client(gw) as c:
        refused = await login(c, keys.user)
        assert refused.status_code == 403
        assert "not an admin key" in refused.text
        assert "set-cookie" not in refused.headers
        assert keys.user not in refused.text  # the key is not echoed back
        wrong = await login(c, "sk-llmgw-" + "x" * 43)
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        assert (await c.get("/admin/api/v1/keys")).status_code == 401


async def test_an_admin_login_gives_a_strict_httponly_expiring_session(gw: RunningGateway) -> None:
    keys = await make_keys(gw)
    async with client(gw) as c:
        response = await login(c, keys.admin)
        assert response.status_code in (302, 303)
        cookie = response.headers["set-cookie"]
        assert cookie.startswith(COOKIE_NAME + "=")
        attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
        assert {"httponly", "samesite", "max-age", "path"} <= attributes
        assert "SameSite=Strict" in cookie and "Path=/admin" in cookie
        assert keys.admin not in cookie  # only the key's id is in the session, never its secret
        page = await c.get("/admin/")
        assert page.status_code == 200
        assert keys.admin not in page.text
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"
        listed = await c.get("/admin/api/v1/keys")
        assert listed.status_code == 200
        assert {k["name"] for k in listed.json()["keys"]} == {"root", "app"}


async def test_state_changes_need_the_csrf_token_and_the_same_origin(gw: RunningGateway) -> None:
    keys = await make_keys(gw)
    async with client(gw) as c:
        await login(c, keys.admin)
        token = csrf_of((await c.get("/admin/keys")).text)
        body = {"name": "team", "parent_id": keys.group_id}
        assert (await c.post("/admin/api/v1/groups", json=body)).status_code == 403
        assert (await c.post("/admin/api/v1/groups", json=body, headers={"x-csrf-token": "nope"})).status_code == 403
        foreign = {"x-csrf-token": token, "origin": "http://evil.example"}
        assert (await c.post("/admin/api/v1/groups", json=body, headers=foreign)).status_code == 403
        cross = {"x-csrf-token": token, "sec-fetch-site": "cross-site"}
        assert (await c.post("/admin/api/v1/groups", json=body, headers=cross)).status_code == 403
        ok = await c.post("/admin/api/v1/groups", json=body, headers={"x-csrf-token": token, "origin": gw.url})
        assert ok.status_code == 201, ok.text
        assert ok.json()["group"]["name"] == "team"
        # Logging out needs the token too (a foreign page must not be able to log the operator out).
        assert (await c.post("/admin/logout")).status_code == 403
        out = await c.post("/admin/logout", data={"csrf": token})
        assert out.status_code in (302, 303) and "Max-Age=0" in out.headers["set-cookie"]


async def test_a_session_ends_when_its_key_is_revoked(gw: RunningGateway) -> None:
    keys = await make_keys(gw)
    async with client(gw) as c:
        await login(c, keys.admin)
        assert (await c.get("/admin/api/v1/keys")).status_code == 200
        async with httpx2.AsyncClient(base_url=gw.listening.admin_url) as admin:
            assert (await admin.post(f"/api/v1/keys/{keys.admin_id}/revoke")).status_code == 200
        await gw.tenancy.state.refresh()
        assert (await c.get("/admin/api/v1/keys")).status_code == 401
        assert (await c.get("/admin/")).status_code in (302, 303)


async def test_a_forged_or_tampered_cookie_is_refused(gw: RunningGateway) -> None:
    keys = await make_keys(gw)
    async with client(gw) as c:
        await login(c, keys.admin)
        value = c.cookies[COOKIE_NAME]
    body, _, signature = value.rpartition(".")
    forged = SessionSigner(b"\x01" * 32).new(keys.admin_id)[1]
    flipped = body[:-1] + ("A" if body[-1] != "A" else "B") + "." + signature
    for bad in (forged, flipped, "garbage", ""):
        async with httpx2.AsyncClient(base_url=gw.url, cookies={COOKIE_NAME: bad}) as c:
            assert (await c.get("/admin/api/v1/keys")).status_code == 401, bad


def test_sessions_expire() -> None:
    now = [1000.0]
    signer = SessionSigner(b"\x02" * 32, lifetime=60, clock=lambda: now[0])
    session, value = signer.new("key-1")
    assert signer.load(value) == session
    now[0] += 59
    assert signer.load(value) is not None
    now[0] += 2
    assert signer.load(value) is None


async def test_the_admin_listener_serves_the_pages_and_refuses_cross_site_changes(gw: RunningGateway) -> None:
    admin_url = gw.listening.admin_url
    async with httpx2.AsyncClient(base_url=admin_url) as c:
        for path in ("/", "/models", "/usage", "/capacity", "/keys", "/history"):
            page = await c.get(path)
            assert page.status_code == 200, path
            assert "text/html" in page.headers["content-type"]
        assert "History is not enabled" in (await c.get("/history")).text
        assert (await c.get("/dashboard/history.json?chart=requests&range=3600")).json()["error"][
            "code"
        ] == "history_disabled"
        script = await c.get("/dashboard-static/dashboard.js")
        assert script.status_code == 200 and "refresh" in script.text
        evil = await c.post("/api/v1/groups", json={"name": "x"}, headers={"origin": "http://evil.example"})
        assert evil.status_code == 403
        same = await c.post("/api/v1/groups", json={"name": "x"}, headers={"origin": admin_url})
        assert same.status_code == 201
        # Not a browser (no Origin): the CLI's requests are untouched.
        assert (await c.post("/api/v1/groups", json={"name": "y"})).status_code == 201


async def test_paths_outside_admin_still_get_the_gateways_answer(gw: RunningGateway) -> None:
    async with client(gw) as c:
        response: Any = await c.get("/elsewhere")
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "invalid_request_error"  # the OpenAI shape
        # A prefix that merely starts like /admin is not the dashboard.
        assert "type" in (await c.get("/administrator")).json()["error"]
