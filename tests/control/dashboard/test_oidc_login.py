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
from control.admin.conftest import Daemon, running_control
from joserfc.jwk import RSAKey

from llmgw_control.admin.org_config import OidcConfig

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
        oidc = OidcConfig(issuer=provider.issuer, client_id=provider.client_id, redirect_url=REDIRECT,
                          admin_values=["llmgw-admins"], read_only_values=["llmgw-viewers"])
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


@pytest.mark.parametrize("tamper", [_aud, _expired, _nonce, _nothing, None],
                         ids=["wrong-audience", "expired", "wrong-nonce", "claim-grants-nothing", "bad-signature"])
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
