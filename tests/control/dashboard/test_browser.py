"""A real headless Chromium against a live fleet: control and a node as processes, the real engine.

It loads every page, checks what they show against what the fleet is (node facts, the engine's
state in the node's words, the model's ready replica, usage rolled up the group tree, a capacity
record), performs the operator's actions (cordon and uncordon a node, create a key and see its
secret once, revoke it), and logs in on the client port: refused with a non-admin key and with
no session, accepted with an admin key, and a state change without the CSRF token refused.
Screenshots of every page land in test-artifacts/dashboard/.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import trio

from llmgw_control.store import open_store
from llmgw_dev.build_engine import ensure_engine
from support.fleet import Fleet, model_entry, running_fleet
from support.waiting import wait_until

from .browser import artifacts, browser_context, require_chromium

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="session")
def engine_archive(llama_server_binary: Path) -> Path:
    return ensure_engine()


def chat(fleet: Fleet, key: str) -> Any:
    client = openai.OpenAI(base_url=fleet.api_url + "/v1", api_key=key, max_retries=0, timeout=120)
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


async def prepare(fleet: Fleet, tiny_model: Path) -> dict[str, Any]:
    """Groups, an admin key and a client key, a served request, and a stored benchmark result."""
    async with httpx2.AsyncClient(base_url=fleet.admin_url, timeout=10) as admin:
        org = (await admin.post("/api/v1/groups", json={"name": "acme"})).json()["group"]
        team = (await admin.post("/api/v1/groups", json={"name": "search", "parent_id": org["id"]})).json()["group"]
        root = (await admin.post("/api/v1/keys", json={"name": "ops", "group_id": org["id"], "admin": True})).json()
        user = (await admin.post("/api/v1/keys", json={"name": "search-app", "group_id": team["id"]})).json()

    async def served() -> bool:
        try:
            await trio.to_thread.run_sync(chat, fleet, user["secret"])
        except openai.AuthenticationError:
            return False
        return True

    # Keys are picked up by the daemon's half-second poll of the store.
    await wait_until(served, timeout=5, interval=0.2)
    async with open_store(str(fleet.root / "control" / "llmgw.db")) as store:
        await store.add_capacity(
            model="tiny",
            profile="cpu",
            node_id="n1",
            engine="llama.cpp",
            concurrency=2,
            tokens_per_s=123.4,
            ttft_p50_s=0.05,
            ttft_p99_s=0.2,
            measured_at=datetime.now(UTC),
        )
    nodes, _ = await fleet.state()
    huge = model_entry(
        "huge", fleet.root / "files" / "models" / tiny_model.name, fleet.agent_url, ram_mib=50_000_000, min_replicas=1
    )
    return {"admin": root["secret"], "user": user["secret"], "node": nodes[0], "huge_model": huge}


def drive(fleet: Fleet, facts: dict[str, Any]) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=20_000)
    shots = artifacts("browser")
    node = facts["node"]
    with browser_context() as context:
        page = context.new_page()
        page.on("dialog", lambda dialog: dialog.accept())
        # Script errors and CSP violations surface here; the expected 401/403s of the checks below
        # are logged by Chromium as failed resource loads, which are told apart by their text.
        problems: list[str] = []
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.on(
            "console",
            lambda msg: (
                problems.append(msg.text) if msg.type == "error" and "Failed to load resource" not in msg.text else None
            ),
        )

        # ---- the admin listener: every page, then actions
        page.goto(fleet.admin_url + "/")
        card = page.locator('section.node[data-node="n1"]')
        expect(card).to_be_visible()
        expect(card.locator("dd.os")).to_have_text(node["facts"]["os"])
        expect(card.locator("dd.cpu")).to_contain_text(f"{node['facts']['cores']} cores")
        expect(card.locator("dd.engines")).to_contain_text(re.compile(r"installed \S+"))
        # Where the install came from, as the node's manifest records it (issue 21).
        expect(card.locator("dd.engines .provenance")).to_contain_text(
            re.compile(
                r"^from http://127\.0\.0\.1:\d+/releases/llama\.cpp/\S+ \(unsigned index\): "
                r"llama-\S+ sha256:[0-9a-f]{16}…; installed \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ, "
                r"control epoch \d+$"
            )
        )
        expect(card.locator("dd.shards")).to_contain_text("ready")
        for warning in node["warnings"]:
            expect(card.locator(".warning")).to_contain_text(warning)
        page.screenshot(path=shots / "fleet.png", full_page=True)

        card.get_by_role("button", name="Cordon").click()
        expect(card.locator(".badge", has_text="cordoned")).to_be_visible()
        assert _node(fleet)["cordoned"] is True
        page.screenshot(path=shots / "fleet-cordoned.png", full_page=True)
        card.get_by_role("button", name="Uncordon").click()
        expect(card.get_by_role("button", name="Cordon")).to_be_visible()
        assert _node(fleet)["cordoned"] is False

        page.goto(fleet.admin_url + "/models")
        row = page.locator('tr[data-model="tiny:cpu"]')
        expect(row.locator("td.replicas")).to_contain_text("on n1:")
        expect(row.locator("td.replicas .badge")).to_have_text("ready")
        page.screenshot(path=shots / "models.png", full_page=True)

        # Add a model through the page; it needs more RAM than any node has, and the page says so.
        form = page.locator('form[data-action="add-model"]')
        page.locator("#add-model summary").click()
        form.locator("textarea").fill("{not json")
        form.get_by_role("button", name="Add model").click()
        expect(page.locator("#flash")).to_contain_text("not valid JSON")
        form.locator("textarea").fill(json.dumps(facts["huge_model"]))
        form.get_by_role("button", name="Add model").click()
        expect(page.locator("#flash")).to_contain_text("Model huge added")
        huge = page.locator('tr[data-model="huge:cpu"]')
        expect(huge.locator("td.status")).to_contain_text("not running")
        expect(huge.locator("td.status")).to_contain_text("no node fits")
        page.screenshot(path=shots / "models-added.png", full_page=True)

        page.goto(fleet.admin_url + "/usage")
        rows = page.locator("#usage tbody tr")
        # The request was made with the team's key: the team has it, and its parent rolls it up.
        expect(rows.filter(has_text="search").locator("td.total-requests")).to_have_text("1")
        expect(rows.filter(has_text="acme").locator("td.total-requests")).to_have_text("1")
        page.screenshot(path=shots / "usage.png", full_page=True)

        page.goto(fleet.admin_url + "/capacity")
        expect(page.locator("#capacity tbody")).to_contain_text("123.4")
        page.screenshot(path=shots / "capacity.png", full_page=True)

        page.goto(fleet.admin_url + "/keys")
        expect(page.locator("#keys tbody")).to_contain_text("search-app")
        form = page.locator('form[data-action="create-key"]')
        form.locator('input[name="name"]').fill("browser-made")
        expect(form.locator("select option", has_text="acme/search")).to_have_count(1)
        form.locator("select").select_option(label="acme/search")
        form.get_by_role("button", name="Create key").click()
        expect(page.locator("#new-secret-value")).to_have_text(re.compile(r"^sk-llmgw-\S{20,}$"))
        secret = page.locator("#new-secret-value").inner_text()
        page.screenshot(path=shots / "keys-created.png", full_page=True)
        made = page.locator("#keys tbody tr", has_text="browser-made")
        expect(made.locator("td.state")).to_have_text("active")
        made.get_by_role("button", name="Revoke").click()
        expect(made.locator("td.state")).to_have_text("revoked")
        assert (
            httpx2.get(fleet.api_url + "/v1/models", headers={"authorization": f"Bearer {secret}"}).status_code == 401
        )
        page.screenshot(path=shots / "keys.png", full_page=True)

        page.goto(fleet.admin_url + "/history")
        expect(page.locator("#history-off")).to_contain_text("[monitoring]")
        page.screenshot(path=shots / "history-off.png", full_page=True)

        # ---- the client port: no session, a non-admin key, then the admin key
        page.goto(fleet.api_url + "/admin/")
        expect(page).to_have_url(fleet.api_url + "/admin/login")
        assert page.evaluate("fetch('/admin/api/v1/nodes').then(r => r.status)") == 401
        page.fill('input[name="key"]', facts["user"])
        page.get_by_role("button", name="Log in").click()
        expect(page.locator("#login-error")).to_contain_text("not an admin key")
        page.screenshot(path=shots / "login-refused.png", full_page=True)
        page.fill('input[name="key"]', facts["admin"])
        page.get_by_role("button", name="Log in").click()
        expect(page).to_have_url(fleet.api_url + "/admin/")
        card = page.locator('section.node[data-node="n1"]')
        expect(card.locator("dd.os")).to_have_text(node["facts"]["os"])
        page.screenshot(path=shots / "client-fleet.png", full_page=True)
        # The browser cannot read the session cookie (HttpOnly).
        assert "llmgw_admin_session" not in page.evaluate("document.cookie")
        # A state change without the CSRF token is refused; the page's own (with it) works.
        status = page.evaluate("fetch('/admin/api/v1/nodes/n1/cordon', {method: 'POST'}).then(r => r.status)")
        assert status == 403
        assert _node(fleet)["cordoned"] is False
        card.get_by_role("button", name="Cordon").click()
        expect(card.locator(".badge", has_text="cordoned")).to_be_visible()
        assert _node(fleet)["cordoned"] is True
        card.get_by_role("button", name="Uncordon").click()
        expect(card.get_by_role("button", name="Cordon")).to_be_visible()
        for path in ("models", "usage", "capacity", "keys", "history", "audit"):
            page.goto(f"{fleet.api_url}/admin/{path}")
            expect(page.locator("body")).to_have_attribute("data-loaded", "true")
            expect(page.locator("#status")).not_to_contain_text("failed")
            # Through the session: the live traffic and the audit log read from /admin/api/v1.
            if path == "models":
                expect(page.locator("body")).to_have_attribute("data-live-loaded", "true")
            elif path == "audit":
                expect(page.locator("#audit tbody tr[data-audit-id]").first).to_be_visible()
        assert problems == []
        page.get_by_role("button", name="Log out").click()
        expect(page).to_have_url(fleet.api_url + "/admin/login")
        assert page.evaluate("fetch('/admin/api/v1/nodes').then(r => r.status)") == 401


def _node(fleet: Fleet) -> dict[str, Any]:
    nodes = httpx2.get(fleet.admin_url + "/api/v1/nodes").json()["nodes"]
    return next(n for n in nodes if n["id"] == "n1")


async def test_every_page_and_the_actions_in_a_real_browser(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    require_chromium()
    async with running_fleet(tmp_path, tiny_model, engine_archive) as fleet:
        await fleet.add_node("n1")
        facts = await prepare(fleet, tiny_model)
        await trio.to_thread.run_sync(drive, fleet, facts)
