"""The dashboard's "Find a model" page in a real headless Chromium, against a running control and
a fake Hub: search, a repository's files with their fit on a node, Add (pull with progress), edit
the draft, publish, and see the model in the catalog."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio

from llmgw_control.mirror.config import HubConfig
from llmgw_dev.fake_hub import FakeHub, FakeRepo, run_fake_hub
from support.waiting import wait_until

from ..admin.conftest import Daemon, fake_node, running_control
from .browser import artifacts, browser_context, require_chromium

REPO, FILE = "acme/tiny-chat-GGUF", "tiny-chat.Q8_0.gguf"


# Left out of the quick tier (slow: a real headless Chromium, seconds to start).
pytestmark = pytest.mark.slow


def drive(admin_url: str) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=20_000)
    shots = artifacts("find-a-model")
    with browser_context() as context:
        page = context.new_page()
        problems: list[str] = []
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(admin_url + "/find")
        expect(page.locator("nav a.current")).to_have_text("Find a model")
        page.fill("#hub-search input[name=q]", "tiny")
        page.click("#hub-search button")
        row = page.locator(f'#hub-repos tr[data-repo="{REPO}"]')
        expect(row).to_contain_text("9")
        expect(page.locator("#hub-repos tbody tr")).to_have_count(1)
        row.locator("button").click()
        file_row = page.locator(f'#hub-files tr[data-file="{FILE}"]')
        expect(file_row).to_contain_text("Q8_0")
        expect(file_row).to_contain_text("fits")
        huge = page.locator('#hub-files tr[data-file="huge-F16.gguf"]')
        expect(huge).to_contain_text("does not fit")
        page.screenshot(path=str(shots / "files.png"), full_page=True)

        file_row.locator("button").click()
        pull_row = page.locator("#pulls tbody tr").first
        expect(pull_row).to_contain_text("downloading")
        expect(pull_row.locator("progress")).to_be_visible()
        page.screenshot(path=str(shots / "pulling.png"), full_page=True)
        expect(pull_row).to_contain_text("ready", timeout=30_000)
        expect(pull_row).to_contain_text("tiny-chat.q8_0")

        pull_row.locator('button[data-find="edit"]').click()
        editor = page.locator("#draft-panel textarea")
        expect(editor).to_have_value(re.compile(r'"name"'))  # filled once the pull is fetched
        draft = json.loads(editor.input_value())
        draft["name"] = "tiny"
        draft["profiles"][0]["context"] = 1024
        editor.fill(json.dumps(draft))
        page.click('#draft-panel button[type="submit"]')
        expect(page.locator("#flash")).to_contain_text("Draft tiny saved")
        expect(pull_row).to_contain_text("tiny (context 1024")
        pull_row.locator('button[data-find="publish"]').click()
        expect(page.locator("#flash")).to_contain_text("Model tiny added to the catalog")
        expect(pull_row).to_contain_text("published")
        page.screenshot(path=str(shots / "published.png"), full_page=True)
        assert problems == [], problems


async def test_find_a_model_page(tmp_path: Path, tiny_gguf: bytes) -> None:
    require_chromium()
    repos = {
        REPO: FakeRepo(files={FILE: tiny_gguf, "huge-F16.gguf": b"GGUF"}, downloads=9),
        "acme/other": FakeRepo(files={"x.gguf": b"GGUF"}, downloads=1),
    }
    hub = FakeHub(repos=repos, chunk_delay=0.5, claimed_sizes={"huge-F16.gguf": 64 * 1024**3})
    async with (
        run_fake_hub(hub),
        running_control(
            tmp_path,
            files_dir=str(tmp_path / "files"),
            control_settings={"hub": HubConfig(endpoint=hub.url, allow_networks=["127.0.0.0/8"])},
        ) as daemon,
    ):
        async with fake_node(daemon, "n1"):
            await ready(daemon)
            await trio.to_thread.run_sync(drive, daemon.listening.admin_url)
        model = (await daemon.admin.get("/models/tiny")).json()["model"]
        assert model["profiles"][0]["context"] == 1024


async def ready(daemon: Daemon) -> None:
    async def a_node_ready() -> bool:
        return any(n["state"] == "ready" for n in (await daemon.admin.get("/nodes")).json()["nodes"])

    await wait_until(a_node_ready, timeout=10)
