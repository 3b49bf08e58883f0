"""The fleet page in a real browser with a scripted node: its warnings and its engine's own words,
updated without a reload as the node reports (the page polls the API).

Faster than the real-engine test and able to show what a healthy test machine never has: a CPU
without AVX2, an engine install in progress and then failing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from control.admin.conftest import fake_node, running_control

from llmgw_shared.wire import EngineState, EngineStateReport, encode

from .browser import artifacts, browser_context, require_chromium

# Left out of the quick tier (slow: a real headless Chromium, seconds to start).
pytestmark = pytest.mark.slow


NO_AVX2 = "this CPU has no AVX2: engines run about five times slower; a VM CPU type is the usual cause"


async def test_the_fleet_page_shows_the_nodes_words_and_follows_them(tmp_path: Path) -> None:
    require_chromium()
    async with running_control(tmp_path) as daemon, fake_node(daemon, "cpu-1", warnings=[NO_AVX2]) as node:
        downloading = EngineState(
            "llama.cpp", "b11312", "installing", detail="downloading llama-b11312-bin-linux-x64.tar.gz (6 MB, 41%)"
        )
        await node.ws.send_message(encode(EngineStateReport(downloading)))
        changed = trio.Event()
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def drive() -> None:
            from playwright.sync_api import expect

            expect.set_options(timeout=15_000)
            with browser_context() as context:
                page = context.new_page()
                page.goto(daemon.admin_url + "/")
                card = page.locator('section.node[data-node="cpu-1"]')
                expect(card.locator(".warning")).to_have_text("⚠ " + NO_AVX2)
                expect(card.locator("dd.os")).to_have_text("Debian")
                expect(card.locator("dd.cpu")).to_contain_text("Test CPU · 4 cores · x86_64")
                expect(card.locator("dd.engines")).to_contain_text(
                    "llama.cpp b11312: installing: downloading llama-b11312-bin-linux-x64.tar.gz (6 MB, 41%)"
                )
                page.screenshot(path=artifacts("node-words") / "installing.png", full_page=True)
                trio.from_thread.run_sync(changed.set, trio_token=token)
                # No reload: the page's own polling shows the node's next report.
                expect(card.locator("dd.engines")).to_contain_text("failed: glibc 2.31 is older than 2.35")
                expect(card.locator("dd.engines .badge")).to_have_class("badge bad")
                page.screenshot(path=artifacts("node-words") / "failed.png", full_page=True)

        async with trio.open_nursery() as nursery:

            async def browser() -> None:
                await trio.to_thread.run_sync(drive)
                done.set()

            nursery.start_soon(browser)
            await changed.wait()
            failed = EngineState("llama.cpp", "b11312", "failed", detail="glibc 2.31 is older than 2.35")
            await node.ws.send_message(encode(EngineStateReport(failed)))
            await done.wait()
