"""Single sign-on in a real headless Chromium (issue 34): the login page's button, the loopback
OpenID Connect provider (``oidc_provider.py``: authorization code flow with PKCE, real RSA-signed
ID tokens), and back to the dashboard with the role the claim maps to. A read-only user sees no
control that changes anything and is refused a write; a token with the wrong audience or a bad
signature ends on the login page with the reason, never a traceback.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from control.admin.conftest import Daemon, running_control
from joserfc.jwk import RSAKey

from llmgw_control.admin.org_config import OidcConfig

from .browser import artifacts, browser_context, require_chromium
from .oidc_provider import Provider, running_provider

pytestmark = [pytest.mark.slow]


@attrs.define
class Rig:
    daemon: Daemon
    provider: Provider
    base: str


def _free_port() -> int:
    # The redirect URL is registered before the daemon starts, so its client port is chosen here.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    require_chromium()
    base = f"http://127.0.0.1:{_free_port()}"
    async with running_provider() as provider:
        oidc = OidcConfig(
            issuer=provider.issuer,
            client_id=provider.client_id,
            redirect_url=f"{base}/admin/login",
            admin_values=["llmgw-admins"],
            read_only_values=["llmgw-viewers"],
        )
        async with running_control(tmp_path, control_settings={"oidc": oidc, "listen": base[7:]}) as daemon:
            assert daemon.listening.api_url == base
            yield Rig(daemon, provider, base)


def sign_in(base: str, name: str, check: Callable[[Any], None]) -> list[str]:
    """Click "Sign in with single sign-on" in a fresh Chromium, then ``check(page)``; script errors."""
    from playwright.sync_api import expect

    expect.set_options(timeout=20_000)
    with browser_context() as context:
        page = context.new_page()
        problems: list[str] = []
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.on(
            "console",
            lambda msg: (
                problems.append(msg.text) if msg.type == "error" and "Failed to load resource" not in msg.text else None
            ),
        )
        page.goto(base + "/admin/")
        expect(page).to_have_url(base + "/admin/login")
        page.locator("#sso-login").click()
        check(page)
        page.screenshot(path=artifacts("sso") / f"{name}.png", full_page=True)
        return problems


def _admin(base: str) -> Callable[[Any], None]:
    def check(page: Any) -> None:
        from playwright.sync_api import expect

        # Through the provider and back: the dashboard, signed in as the token's user.
        expect(page).to_have_url(base + "/admin/")
        expect(page.locator("header .who")).to_have_text("ada@example.org")
        expect(page.locator("#read-only")).to_have_count(0)
        page.goto(base + "/admin/keys")
        expect(page.locator('form[data-action="create-key"]')).to_be_visible()
        page.locator('form[data-action="create-key"] input[name="name"]').fill("from-sso")
        expect(page.locator('form[data-action="create-key"] select option')).not_to_have_count(0)
        page.locator('form[data-action="create-key"]').get_by_role("button", name="Create key").click()
        expect(page.locator("#new-secret-value")).to_have_text(re.compile(r"^sk-llmgw-\S{20,}$"))
        # The Keys page ends another user's sessions (POST /sessions/revoke through the session).
        page.locator("#end-sessions summary").click()
        page.locator('form[data-action="end-sessions"] input[name="user"]').fill("bob@example.org")
        page.get_by_role("button", name="End sessions").click()
        expect(page.locator("#flash")).to_have_text("The dashboard sessions of bob@example.org are ended.")

    return check


def _read_only(base: str) -> Callable[[Any], None]:
    def check(page: Any) -> None:
        from playwright.sync_api import expect

        expect(page).to_have_url(base + "/admin/")
        expect(page.locator("#read-only")).to_have_text("read-only")
        page.goto(base + "/admin/keys")
        expect(page.locator("#keys tbody")).to_contain_text("ops-key")
        # No control that changes anything: no create form, no Revoke button.
        expect(page.locator('form[data-action="create-key"]')).to_be_hidden()
        expect(page.get_by_role("button", name="Revoke")).to_have_count(0)
        page.goto(base + "/admin/usage")
        expect(page.locator("#add-group")).to_be_hidden()
        # And the API refuses a write made anyway, with the page's own CSRF token.
        status = page.evaluate("""fetch('/admin/api/v1/groups', {method: 'POST',
            headers: {'content-type': 'application/json',
                      'x-csrf-token': document.querySelector('meta[name=csrf-token]').content},
            body: JSON.stringify({name: 'nope'})}).then(r => r.status)""")
        assert status == 403

    return check


def _refused(base: str, reason: str) -> Callable[[Any], None]:
    def check(page: Any) -> None:
        from playwright.sync_api import expect

        expect(page.locator("#login-error")).to_contain_text(reason)
        assert page.url.startswith(base + "/admin/login?")
        body = page.locator("body").inner_text()
        assert "Traceback" not in body and "Error" not in body
        assert "llmgw_admin_session" not in {c["name"] for c in page.context.cookies()}

    return check


async def test_an_admin_signs_in_through_the_provider(rig: Rig) -> None:
    ok = await rig.daemon.admin.post("/groups", json={"name": "org"})
    assert ok.status_code == 201
    problems = await trio.to_thread.run_sync(sign_in, rig.base, "admin", _admin(rig.base))
    assert problems == []
    assert rig.provider.token_requests[-1]["code_verifier"]
    rows = (await rig.daemon.admin.get("/audit", params={"resource": "key"})).json()["entries"]
    assert [r["actor"] for r in rows] == ["user:ada@example.org"]
    [ended] = (await rig.daemon.admin.get("/audit", params={"resource": "session"})).json()["entries"]
    assert (ended["actor"], ended["resource_id"]) == ("user:ada@example.org", "user:bob@example.org")


async def test_a_read_only_user_sees_no_controls_and_is_refused(rig: Rig) -> None:
    group = (await rig.daemon.admin.post("/groups", json={"name": "org"})).json()["group"]["id"]
    assert (await rig.daemon.admin.post("/keys", json={"name": "ops-key", "group_id": group})).status_code == 201
    rig.provider.claims["groups"] = ["llmgw-viewers"]
    problems = await trio.to_thread.run_sync(sign_in, rig.base, "read-only", _read_only(rig.base))
    assert problems == []
    assert [g["name"] for g in (await rig.daemon.admin.get("/groups")).json()["groups"]] == ["org"]


def _aud(claims: dict[str, Any]) -> None:
    claims["aud"] = "someone-else"


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("wrong-audience", "The provider's ID token was refused: it was issued to another client (audience)."),
        (
            "bad-signature",
            "The provider's ID token was refused: its signature does not verify with the provider's published keys.",
        ),
    ],
)
async def test_a_bad_token_shows_the_reason_on_the_login_page(rig: Rig, bad: str, reason: str) -> None:
    if bad == "wrong-audience":
        rig.provider.tamper = _aud
    else:
        rig.provider.signing_key = RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)
    await trio.to_thread.run_sync(sign_in, rig.base, bad, _refused(rig.base, reason))
