"""Dashboard single sign-on (issue 34) against a real OpenID Connect provider on loopback
(``oidc_provider.py``: real RSA-signed ID tokens, discovery, JWKS, a token endpoint checking PKCE).

The browser is played by httpx2: start at ``/admin/login?sso=start``, follow the provider's
redirect back with the code, and use the session. Refused: a wrong audience, an expired token, a
bad signature, a wrong nonce, a claim that grants nothing; a read-only user's writes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx2
import pytest
import trio
from control.admin.conftest import Daemon, running_control
from joserfc.jwk import RSAKey

from llmgw_control.admin.dashboard.revocations import REFRESH_S, SessionRevocations
from llmgw_control.admin.org_config import OidcConfig
from support.waiting import wait_until

from .oidc_provider import Provider, running_provider

# The provider sends the browser back here; the test carries the code to the daemon's real port.
REDIRECT = "http://127.0.0.1:9/admin/login"


@attrs.define
class Rig:
    daemon: Daemon
    provider: Provider


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with running_provider() as provider:
        oidc = OidcConfig(
            issuer=provider.issuer,
            client_id=provider.client_id,
            redirect_url=REDIRECT,
            admin_values=["llmgw-admins"],
            read_only_values=["llmgw-viewers"],
        )
        async with running_control(tmp_path, control_settings={"oidc": oidc}) as daemon:
            yield Rig(daemon, provider)


async def sign_in(rig: Rig, c: httpx2.AsyncClient) -> httpx2.Response:
    start = await c.get("/admin/login", params={"sso": "start"})
    assert start.status_code == 302, start.text
    async with httpx2.AsyncClient() as browser:
        back = await browser.get(start.headers["location"])
    assert back.status_code == 302
    query = urlsplit(back.headers["location"]).query
    return await c.get(f"/admin/login?{query}")


def client(rig: Rig) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(base_url=rig.daemon.listening.api_url, timeout=20)


async def test_an_admin_signs_in_and_acts_as_themselves(rig: Rig) -> None:
    async with client(rig) as c:
        login = await sign_in(rig, c)
        assert login.status_code == 200 and "Signed in" in login.text
        page = await c.get("/admin/")
        assert page.status_code == 200 and "ada@example.org" in page.text
        csrf = page.text.split('name="csrf-token" content="')[1].split('"')[0]
        created = await c.post("/admin/api/v1/groups", json={"name": "org"}, headers={"x-csrf-token": csrf})
        assert created.status_code == 201, created.text
    # PKCE: the token request carried a verifier (the provider checked it against the challenge).
    assert rig.provider.token_requests[-1]["code_verifier"]
    rows = (await rig.daemon.admin.get("/audit", params={"resource": "group"})).json()["entries"]
    assert [r["actor"] for r in rows] == ["user:ada@example.org"]


async def test_a_read_only_user_reads_and_is_refused_writes(rig: Rig) -> None:
    rig.provider.claims["groups"] = ["llmgw-viewers"]
    async with client(rig) as c:
        assert (await sign_in(rig, c)).status_code == 200
        page = await c.get("/admin/")
        csrf = page.text.split('name="csrf-token" content="')[1].split('"')[0]
        assert (await c.get("/admin/api/v1/groups")).status_code == 200
        refused = await c.post("/admin/api/v1/groups", json={"name": "org"}, headers={"x-csrf-token": csrf})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "read_only"
    assert (await rig.daemon.admin.get("/groups")).json()["groups"] == []
    rows = (await rig.daemon.admin.get("/audit", params={"outcome": "refused"})).json()["entries"]
    assert rows[0]["actor"] == "user:ada@example.org" and rows[0]["changes"][0]["after"]["reason"] == "read_only"


def _aud(c: dict[str, Any]) -> None:
    c["aud"] = "someone-else"


def _expired(c: dict[str, Any]) -> None:
    c["exp"] = c["iat"] - 3600


def _nonce(c: dict[str, Any]) -> None:
    c["nonce"] = "not-the-one-sent"


def _nothing(c: dict[str, Any]) -> None:
    c["groups"] = ["marketing"]


@pytest.mark.parametrize(
    "tamper",
    [_aud, _expired, _nonce, _nothing, None],
    ids=["wrong-audience", "expired", "wrong-nonce", "claim-grants-nothing", "bad-signature"],
)
async def test_bad_tokens_are_refused(rig: Rig, tamper: Callable[[dict[str, Any]], None] | None) -> None:
    if tamper is None:
        rig.provider.signing_key = RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)
    else:
        rig.provider.tamper = tamper
    async with client(rig) as c:
        login = await sign_in(rig, c)
        assert login.status_code == 403, login.text
        assert "llmgw_admin_session=" not in login.headers.get("set-cookie", "").replace("llmgw_admin_session=;", "")
        assert (await c.get("/admin/api/v1/groups")).status_code == 401


async def test_a_callback_without_the_started_sign_in_is_refused(rig: Rig) -> None:
    async with client(rig) as c:
        start = await c.get("/admin/login", params={"sso": "start"})
        async with httpx2.AsyncClient() as browser:
            back = await browser.get(start.headers["location"])
    query = urlsplit(back.headers["location"]).query
    async with client(rig) as other:  # another browser: no pending cookie (a login CSRF)
        assert (await other.get(f"/admin/login?{query}")).status_code == 403


async def test_ending_a_users_sessions_on_the_server(rig: Rig) -> None:
    """``POST /api/v1/sessions/revoke``: the user's cookie stops working at once (the copy another
    daemon holds within REFRESH_S), another user's goes on working, and the user may sign in again."""
    async with client(rig) as ada, client(rig) as bob:
        assert (await sign_in(rig, ada)).status_code == 200
        rig.provider.claims = {"sub": "u-2", "email": "bob@example.org", "groups": ["llmgw-admins"]}
        assert (await sign_in(rig, bob)).status_code == 200
        # ada's cookie, as a second browser (or a thief) holds it
        stolen = dict(ada.cookies)
        assert (await ada.get("/admin/api/v1/groups")).status_code == 200

        ended = await rig.daemon.admin.post("/sessions/revoke", json={"user": "ada@example.org"})
        assert ended.status_code == 200, ended.text
        assert ended.json()["subject"] == "user:ada@example.org"
        assert (await ada.get("/admin/api/v1/groups")).status_code == 401
        page = await ada.get("/admin/")
        assert page.status_code == 302 and page.headers["location"].endswith("/admin/login")
        assert (await bob.get("/admin/api/v1/groups")).status_code == 200

        # Signing in again gives a session issued after the revocation.
        rig.provider.claims = {"sub": "u-1", "email": "ada@example.org", "groups": ["llmgw-admins"]}
        ada.cookies.clear()
        assert (await sign_in(rig, ada)).status_code == 200
        assert (await ada.get("/admin/api/v1/groups")).status_code == 200
        async with client(rig) as thief:
            thief.cookies.update(stolen)
            assert (await thief.get("/admin/api/v1/groups")).status_code == 401

        # Logging out ends that session on the server: a kept copy of the cookie no longer works.
        kept = dict(bob.cookies)
        page = await bob.get("/admin/")
        csrf = page.text.split('name="csrf-token" content="')[1].split('"')[0]
        out = await bob.post("/admin/logout", data={"csrf": csrf})
        assert out.status_code == 302
        async with client(rig) as copy:
            copy.cookies.update(kept)
            assert (await copy.get("/admin/api/v1/groups")).status_code == 401
        assert (await ada.get("/admin/api/v1/groups")).status_code == 200

    rows = (await rig.daemon.admin.get("/audit", params={"resource": "session"})).json()["entries"]
    assert [(r["action"], r["resource_id"], r["actor"]) for r in rows] == [
        ("POST /api/v1/sessions/revoke", "user:ada@example.org", "loopback")
    ]


async def test_a_revocation_reaches_another_daemon_on_the_same_store(rig: Rig) -> None:
    """A revocation written by another daemon (here: another ``SessionRevocations`` on the same store,
    which this daemon's copy does not share) ends the session here within REFRESH_S."""
    async with client(rig) as ada:
        assert (await sign_in(rig, ada)).status_code == 200
        other_daemon = SessionRevocations(rig.daemon.listening.tenancy.store)
        await other_daemon.revoke("user:ada@example.org")
        started = trio.current_time()

        async def refused() -> bool:
            return (await ada.get("/admin/api/v1/groups")).status_code == 401

        await wait_until(refused, timeout=REFRESH_S + 3)
        assert trio.current_time() - started < REFRESH_S + 3
