"""The Models page's live traffic and the Audit page in a real browser (issue 34): figures drawn
from what the gateway answered, hostile names shown as text, the audit log filtered and paged."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
import trio

from llmgw_dev.fake_engine import FakeEngine
from support.gateway import chat_body, endpoint, running_gateway

from .browser import artifacts, browser_context, require_chromium

# Left out of the quick tier (slow: a real headless Chromium, seconds to start).
pytestmark = pytest.mark.slow

# An operator's model name that would run script if a page inserted it as markup.
HOSTILE = '<img src=x onerror="window.pwned=1">'


def _watch(page: Any) -> list[str]:
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on(
        "console",
        lambda msg: (
            problems.append(msg.text) if msg.type == "error" and "Failed to load resource" not in msg.text else None
        ),
    )
    return problems


async def test_the_models_page_draws_live_traffic_per_model_and_replica(fake_engine: FakeEngine) -> None:
    require_chromium()
    fake_engine.behavior.models = [HOSTILE]
    fake_engine.behavior.chunks = 3
    async with running_gateway(endpoint("e1", fake_engine.url, HOSTILE)) as gw:
        for stream in (True, True, False, False, False):
            answer = await gw.client.post("/v1/chat/completions", json=chat_body(HOSTILE, stream=stream))
            assert answer.status_code == 200
        admin_url = gw.listening.admin_url
        async with httpx2.AsyncClient(timeout=10) as admin:
            daemon = (await admin.get(admin_url + "/api/v1/traffic")).json()["daemon"]

        def drive() -> None:
            from playwright.sync_api import expect

            expect.set_options(timeout=15_000)
            with browser_context() as context:
                page = context.new_page()
                problems = _watch(page)
                page.goto(admin_url + "/models")
                expect(page.locator("body")).to_have_attribute("data-live-loaded", "true")
                model = page.locator('tr[data-live="model"]')
                expect(model).to_have_count(1)
                # Text, never markup: the name shows as written and no element came of it.
                expect(model.locator("td.name")).to_have_text(HOSTILE)
                assert page.locator("#live-traffic img").count() == 0
                assert page.evaluate("window.pwned") is None
                expect(model.locator("td.req")).not_to_have_text("0")
                expect(model.locator("td.ttft50")).to_contain_text("ms")
                expect(model.locator("svg.spark rect.req")).to_have_count(1)
                replica = page.locator('tr[data-live="replica"]')
                expect(replica).to_have_attribute("data-name", "e1")
                # Which daemon counted this, and that others count their own.
                expect(page.locator("#live-daemon")).to_have_text(daemon)
                expect(page.locator("#live-note")).to_contain_text("Each control daemon")
                page.screenshot(path=artifacts("live-traffic") / "models.png", full_page=True)
                assert problems == []

        await trio.to_thread.run_sync(drive)


async def test_the_audit_page_lists_filters_and_pages_the_log() -> None:
    require_chromium()
    async with running_gateway() as gw:
        admin_url = gw.listening.admin_url
        async with httpx2.AsyncClient(base_url=admin_url + "/api/v1", timeout=10) as admin:
            for i in range(12):
                assert (await admin.post("/groups", json={"name": f"team-{i:02}"})).status_code == 201
            hostile = (await admin.post("/groups", json={"name": HOSTILE})).json()["group"]["id"]
            parent = (await admin.get("/groups")).json()["groups"][0]["id"]
            key = await admin.post("/keys", json={"name": "audited", "group_id": parent})
            assert key.status_code == 201
            secret = key.json()["secret"]

        def drive() -> None:
            from playwright.sync_api import expect

            expect.set_options(timeout=15_000)
            with browser_context() as context:
                page = context.new_page()
                problems = _watch(page)
                page.goto(admin_url + "/audit")
                expect(page.locator("body")).to_have_attribute("data-audit-loaded", "1")
                rows = page.locator("#audit tbody tr[data-audit-id]")
                expect(rows).to_have_count(14)
                # Newest first: the key, then the hostile group, shown as text.
                expect(rows.nth(0).locator("td.resource")).to_contain_text("key")
                expect(rows.nth(1).locator("td.resource")).to_contain_text(hostile)
                expect(rows.nth(1).locator("td.changes")).to_contain_text(HOSTILE)
                assert page.locator("#audit img").count() == 0 and page.evaluate("window.pwned") is None
                # The key's secret is never in the log.
                assert secret not in page.locator("#audit").inner_text()
                page.screenshot(path=artifacts("audit") / "newest.png", full_page=True)

                # Filter by resource, ten rows a page: two pages of groups.
                page.fill('input[name="resource"]', "group")
                page.select_option('select[name="limit"]', "10")
                page.get_by_role("button", name="Filter").click()
                expect(page.locator("#audit-page-note")).to_contain_text("Page 1, 10 entries")
                expect(rows).to_have_count(10)
                first_page = rows.nth(0).get_attribute("data-audit-id")
                page.get_by_role("button", name="Older →").click()
                expect(page.locator("#audit-page-note")).to_contain_text("Page 2, 3 entries")
                expect(rows).to_have_count(3)
                expect(page.get_by_role("button", name="Older →")).to_be_disabled()
                assert rows.nth(0).get_attribute("data-audit-id") != first_page
                for i in range(3):
                    expect(rows.nth(i).locator("td.resource")).to_contain_text("group")

                # By actor (nobody) and by time (a window in the future): nothing matches.
                page.get_by_role("button", name="Newest").click()
                page.fill('input[name="actor"]', "key:nobody")
                page.get_by_role("button", name="Filter").click()
                expect(page.locator("#audit tbody td.empty")).to_have_text("No entries match.")
                page.get_by_role("button", name="Clear").click()
                expect(rows).to_have_count(14)
                page.fill('input[name="since"]', "2999-01-01T00:00:00")
                page.get_by_role("button", name="Filter").click()
                expect(page.locator("#audit tbody td.empty")).to_have_text("No entries match.")
                page.screenshot(path=artifacts("audit") / "nothing-matches.png", full_page=True)
                assert problems == []

        await trio.to_thread.run_sync(drive)
