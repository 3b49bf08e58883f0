"""Pulls against the fake Hub: download, resume after a dropped connection, verification, the
draft from the GGUF header, and the refusals (redirect to a private address, free space, hosts)."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from llmgw_control.api_errors import AdminApiError
from llmgw_control.catalog.gguf import read_metadata
from llmgw_control.mirror.config import HubConfig
from llmgw_control.mirror.hub import Hub
from llmgw_control.mirror.net_guard import NetGuard
from llmgw_control.mirror.pulls import Pull, Pulls
from llmgw_control.store import connect_store
from llmgw_dev.fake_hub import FakeHub, run_fake_hub
from support.waiting import wait_until

REPO, FILE = "acme/tiny-chat-GGUF", "tiny-chat.Q8_0.gguf"


@attrs.define
class Rig:
    hub: FakeHub
    pulls: Pulls
    models: Path


@pytest.fixture
async def rig(fake_hub_repos: FakeHub, tmp_path: Path) -> AsyncIterator[Rig]:
    store = await connect_store(tmp_path / "store.db")
    async with run_fake_hub(fake_hub_repos) as fake, trio.open_nursery() as nursery:
        config = HubConfig(endpoint=fake.url, allow_networks=["127.0.0.0/8"])
        pulls = Pulls(
            Hub(config),
            NetGuard(config),
            tmp_path / "files" / "models",
            "http://control:8090",
            store,
            None,
            max_concurrent=2,
        )
        await nursery.start(pulls.run)
        yield Rig(fake, pulls, tmp_path / "files" / "models")
        nursery.cancel_scope.cancel()
    await store.aclose()


async def finished(pull: Pull) -> Pull:
    await wait_until(lambda: pull.state not in ("queued", "downloading", "verifying"), timeout=30, interval=0.02)
    return pull


async def test_a_hub_pull_lands_verified_and_drafts_a_model(rig: Rig, tiny_gguf: bytes) -> None:
    pull = await finished(await rig.pulls.start({"repo": REPO, "file": FILE}))
    assert pull.state == "ready", pull.error
    assert (rig.models / FILE).read_bytes() == tiny_gguf
    assert not (rig.models / f"{FILE}.partial").exists()
    assert pull.sha256 == hashlib.sha256(tiny_gguf).hexdigest()
    draft = pull.draft
    assert draft is not None and draft.name == "tiny-chat.q8_0"
    profile = draft.profiles[0]
    assert profile.weights.url == f"http://control:8090/files/models/{FILE}"
    assert (profile.weights.sha256, profile.weights.size) == (pull.sha256, len(tiny_gguf))
    meta = read_metadata(tiny_gguf)
    trained = meta[f"{meta['general.architecture']}.context_length"]
    assert profile.context == min(trained, 8192)
    assert pull.estimate_ram_mib > 0 and "GGUF" in pull.estimate_how
    # The library-free download asked for exactly the resolve URL.
    gets = [s.path for s in rig.hub.seen if "/resolve/" in s.path]
    assert gets == [f"/{REPO}/resolve/main/{FILE}"]


async def test_a_dropped_connection_is_resumed_with_range(rig: Rig, tiny_gguf: bytes) -> None:
    rig.hub.cut_after = 100_000
    pull = await finished(await rig.pulls.start({"repo": REPO, "file": FILE}))
    assert pull.state == "ready", pull.error
    assert (rig.models / FILE).read_bytes() == tiny_gguf
    ranges = [s.headers.get("range") for s in rig.hub.seen if "/resolve/" in s.path]
    assert ranges[0] is None and len(ranges) == 2
    assert ranges[1] is not None and 0 < int(ranges[1].removeprefix("bytes=").rstrip("-")) <= 100_000


async def test_a_server_that_ignores_range_restarts_the_file(rig: Rig, tiny_gguf: bytes) -> None:
    (rig.models).mkdir(parents=True)
    (rig.models / f"{FILE}.partial").write_bytes(b"garbage" * 10)
    rig.hub.ignore_range = True
    pull = await finished(await rig.pulls.start({"repo": REPO, "file": FILE}))
    assert pull.state == "ready", pull.error
    assert (rig.models / FILE).read_bytes() == tiny_gguf


async def test_a_wrong_sha256_fails_and_leaves_no_file(rig: Rig) -> None:
    url = f"{rig.hub.url}/{REPO}/resolve/main/{FILE}"
    pull = await finished(await rig.pulls.start({"url": url, "sha256": "0" * 64}))
    assert pull.state == "failed" and "sha256 mismatch" in pull.error
    assert list(rig.models.iterdir()) == []


async def test_a_url_pull_with_the_right_sha256(rig: Rig, tiny_gguf: bytes) -> None:
    url = f"{rig.hub.url}/{REPO}/resolve/main/{FILE}"
    pull = await finished(
        await rig.pulls.start({"url": url, "sha256": hashlib.sha256(tiny_gguf).hexdigest(), "model": "tiny"})
    )
    assert pull.state == "ready", pull.error
    assert pull.draft is not None and pull.draft.name == "tiny" and pull.size == len(tiny_gguf)


@pytest.mark.parametrize(
    "location",
    [
        "http://10.0.0.1/blob",
        "https://169.254.169.254/latest/meta-data",
        "https://evil.example/blob",
        "https://[::1]:8081/api/v1/keys",
    ],
)
async def test_a_redirect_to_a_private_or_unknown_host_is_refused(rig: Rig, location: str) -> None:
    rig.hub.redirect_to = location
    pull = await finished(await rig.pulls.start({"repo": REPO, "file": FILE}))
    assert pull.state == "failed" and "refused redirect" in pull.error


async def test_a_download_redirect_to_another_loopback_host_is_refused_without_the_token(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_HUB_TOKEN", "hf_secret")
    async with run_fake_hub(FakeHub(), host="127.0.0.2") as other:
        rig.hub.redirect_to = f"{other.url}/blob"
        pull = await finished(await rig.pulls.start({"repo": REPO, "file": FILE}))
    assert pull.state == "failed" and "refused redirect" in pull.error
    assert other.seen == []
    resolves = [s for s in rig.hub.seen if "/resolve/" in s.path]
    assert resolves and all(s.headers.get("authorization") == "Bearer hf_secret" for s in resolves)


async def test_too_little_free_space_fails_before_downloading(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: shutil._ntuple_diskusage(10**9, 10**9, 1000))  # type: ignore[attr-defined]
    pull = await finished(await rig.pulls.start({"repo": REPO, "file": FILE}))
    assert pull.state == "failed" and "not enough space" in pull.error
    assert not [s for s in rig.hub.seen if "/resolve/" in s.path]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "https://files.example/m.gguf", "sha256": "0" * 64}, "url"),
        ({"url": "http://127.0.0.1:1/m.gguf", "sha256": "0" * 64}, "url"),
        ({"url": "https://x/m.gguf"}, "sha256"),
        ({"repo": "../etc", "file": FILE}, "repo"),
        ({"repo": REPO, "file": "../../etc/passwd.gguf"}, "file"),
        ({"repo": REPO, "file": "README.md"}, "file"),
        ({"repo": REPO, "file": "big-00001-of-00002.gguf"}, "file"),
        ({"repo": REPO, "file": "missing.gguf"}, "file"),
        ({"repo": REPO, "file": FILE, "model": "a:b"}, "model"),
        ({"repo": REPO, "file": FILE, "extra": 1}, "extra"),
    ],
)
async def test_bad_pull_requests_are_refused_naming_the_field(rig: Rig, body: dict[str, Any], field: str) -> None:
    with pytest.raises(AdminApiError) as caught:
        await rig.pulls.start(body)
    assert caught.value.field == field and caught.value.status in (400, 404)


async def test_cancel_stops_a_pull_and_removes_the_partial_file(rig: Rig) -> None:
    rig.hub.chunk_delay = 0.5
    pull = await rig.pulls.start({"repo": REPO, "file": FILE})
    with trio.fail_after(10):
        await rig.hub.sending.wait()
    await wait_until(lambda: (rig.models / f"{FILE}.partial").exists(), timeout=10, interval=0.02)
    await rig.pulls.cancel(pull.id)
    assert pull.id not in rig.pulls.pulls
    assert not (rig.models / f"{FILE}.partial").exists()
