"""The Models page's replica view in a real browser: an engine's lines, asked of its (scripted)
node, then the lines it writes next, without a reload (issue 19)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from control.admin.conftest import fake_node, model_doc, running_control
from control.admin.test_api_fleet import ready_replicas

from .browser import artifacts, browser_context, require_chromium

# Left out of the quick tier (slow: a real headless Chromium, seconds to start).
pytestmark = pytest.mark.slow


async def test_the_replica_view_shows_the_engines_lines_and_follows_them(tmp_path: Path) -> None:
    require_chromium()
    async with running_control(tmp_path) as daemon:
        assert (await daemon.admin.post("/models", json=model_doc(min_replicas=1))).status_code == 201
        async with fake_node(daemon, "n1") as node:
            (replica,) = await ready_replicas(daemon, "tiny:cpu")
            rid = replica["id"]
            node.logs[rid] = ["main: loading model", "<script>alert(1)</script> main: server is listening"]
            shown = trio.Event()
            token = trio.lowlevel.current_trio_token()

            def drive() -> None:
                from playwright.sync_api import expect

                expect.set_options(timeout=15_000)
                with browser_context() as context:
                    page = context.new_page()
                    page.goto(daemon.admin_url + "/models")
                    page.locator(f'button[data-action="replica-logs"][data-replica="{rid}"]').click()
                    lines = page.locator("#logs-lines")
                    # Text, never markup: an engine's output is not trusted.
                    expect(lines).to_have_text("\n".join(node.logs[rid]))
                    expect(page.locator("#logs-note")).to_contain_text("on node n1")
                    trio.from_thread.run_sync(shown.set, trio_token=token)
                    expect(lines).to_contain_text("srv  update_slots: all slots are idle")
                    page.screenshot(path=artifacts("replica-logs") / "following.png", full_page=True)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, drive)
                await shown.wait()
                node.logs[rid].append("srv  update_slots: all slots are idle")
