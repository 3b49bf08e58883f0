"""The Models page shows each profile's LoRA adapters in a real browser: name, size, default
scale, and which replicas hold it (issue 35); the admin API's model view says the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from control.admin.conftest import fake_node, model_doc, running_control
from control.admin.test_api_fleet import ready_replicas

from support.waiting import wait_until

from .browser import artifacts, browser_context, require_chromium

# Left out of the quick tier (slow: a real headless Chromium, seconds to start).
pytestmark = pytest.mark.slow

ADAPTERS = [
    {
        "name": "support-bot",
        "weights": {"url": "/adapters/support.gguf", "sha256": "c" * 64, "size": 3 << 20},
        "scale": 0.5,
    },
    {
        "name": "legal-bot",
        "weights": {"url": "/adapters/legal.gguf", "sha256": "d" * 64, "size": 200 << 10},
        "scale": 1.0,
    },
]


async def test_the_models_page_lists_adapters_and_the_replicas_holding_them(tmp_path: Path) -> None:
    require_chromium()
    async with running_control(tmp_path) as daemon:
        added = await daemon.admin.post("/models", json=model_doc(min_replicas=1, adapters=ADAPTERS))
        assert added.status_code == 201, added.text
        async with fake_node(daemon, "n1"):
            (replica,) = await ready_replicas(daemon, "tiny:cpu")
            rid = replica["id"]

            async def loaded() -> dict[str, Any] | None:
                view: dict[str, Any] = (await daemon.admin.get("/models")).json()["models"][0]
                return view if view["adapters"][0]["loaded_on"] else None

            view = await wait_until(loaded, timeout=10)
            assert view["adapters"] == [
                {"name": "support-bot", "size": 3 << 20, "scale": 0.5, "loaded_on": [rid]},
                {"name": "legal-bot", "size": 200 << 10, "scale": 1.0, "loaded_on": [rid]},
            ]

            def drive() -> None:
                from playwright.sync_api import expect

                expect.set_options(timeout=15_000)
                with browser_context() as context:
                    page = context.new_page()
                    problems: list[str] = []
                    page.on("pageerror", lambda error: problems.append(str(error)))
                    page.goto(daemon.admin_url + "/models")
                    support = page.locator('#models tr[data-model="tiny:cpu"] li[data-adapter="support-bot"]')
                    expect(support).to_have_text(f"support-bot 3 MiB · scale 0.5 · loaded on {rid}")
                    legal = page.locator('#models tr[data-model="tiny:cpu"] li[data-adapter="legal-bot"]')
                    expect(legal).to_have_text(f"legal-bot 200 KiB · scale 1 · loaded on {rid}")
                    expect(page.locator("#models thead th").last).to_have_text("Adapters")
                    page.screenshot(path=artifacts("adapters") / "models.png", full_page=True)
                    assert problems == []

            await trio.to_thread.run_sync(drive)
