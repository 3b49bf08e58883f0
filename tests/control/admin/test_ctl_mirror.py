"""``ctl models search|files|pull|pulls|publish`` against a running control and a fake Hub."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw_control.mirror.config import HubConfig
from llmgw_dev.fake_hub import FakeHub, FakeRepo, run_fake_hub

from .conftest import Daemon, running_control
from .test_ctl import ok, run

REPO, FILE = "acme/tiny-chat-GGUF", "tiny-chat.Q8_0.gguf"


@pytest.fixture
async def daemon(tmp_path: Path, tiny_gguf: bytes) -> AsyncIterator[Daemon]:
    repos = {REPO: FakeRepo(files={FILE: tiny_gguf, "README.md": b"hi"}, downloads=3)}
    async with (
        run_fake_hub(FakeHub(repos=repos, chunk_delay=0.4)) as hub,
        running_control(
            tmp_path,
            files_dir=str(tmp_path / "files"),
            control_settings={"hub": HubConfig(endpoint=hub.url, allow_networks=["127.0.0.0/8"])},
        ) as d,
    ):
        yield d


@pytest.mark.slow  # left out of the quick tier: ctl as a process through a whole pull
async def test_search_files_pull_with_a_progress_bar_and_publish(daemon: Daemon) -> None:
    found = (await ok(daemon, "models", "search", "tiny")).out.splitlines()
    assert found[0].split() == ["REPOSITORY", "DOWNLOADS", "LIKES", "UPDATED"]
    assert found[1].split()[:2] == [REPO, "3"]
    assert "no GGUF repositories match" in (await ok(daemon, "models", "search", "zzz")).out

    files = (await ok(daemon, "models", "files", REPO)).out.splitlines()
    assert files[1].split()[:2] == [FILE, "Q8_0"] and files[1].rstrip().endswith("no")  # no node yet

    pulled = await ok(daemon, "models", "pull", REPO, FILE, "--model", "tiny")
    bars = pulled.out.split("\r")
    assert any("downloading" in bar and "%" in bar and "/s" in bar for bar in bars), pulled.out
    assert "[" + "#" * 30 + "] 100%" in pulled.out
    assert "draft model 'tiny'" in pulled.out
    pull_id = pulled.out.rsplit("ctl models publish ", 1)[1].split()[0]

    listed = (await ok(daemon, "models", "pulls")).out
    assert pull_id in listed and "ready" in listed
    assert "model tiny added to the catalog" in (await ok(daemon, "models", "publish", pull_id)).out
    assert (await ok(daemon, "--json", "models", "show", "tiny")).json()["model"]["name"] == "tiny"

    failed = await run(daemon, "models", "pull", REPO, "missing.gguf")
    assert failed.code == 1 and "not found" in failed.err
