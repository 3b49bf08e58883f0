"""The model mirror through a running control and its admin API, against a fake Hub: find a model,
see whether it fits, pull it (progress, resume), edit its draft, publish it, and fetch the file from
control as a node does."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx2
import pytest

from llmgw_control.mirror.config import HubConfig
from llmgw_dev.fake_hub import FakeHub, FakeRepo, run_fake_hub
from support.waiting import wait_until

from .conftest import Daemon, fake_node, running_control

REPO, FILE = "acme/tiny-chat-GGUF", "tiny-chat.Q8_0.gguf"
HUGE = 64 * 1024**3  # a file no test node can hold


@attrs.define
class Rig:
    daemon: Daemon
    hub: FakeHub


@pytest.fixture
async def rig(tmp_path: Path, tiny_gguf: bytes) -> AsyncIterator[Rig]:
    repos = {
        REPO: FakeRepo(files={FILE: tiny_gguf}, downloads=9),
        "acme/huge-GGUF": FakeRepo(files={"huge-F16.gguf": b"GGUF"}),
    }
    async with (
        run_fake_hub(FakeHub(repos=repos)) as hub,
        running_control(
            tmp_path,
            files_dir=str(tmp_path / "files"),
            control_settings={"hub": HubConfig(endpoint=hub.url, allow_networks=["127.0.0.0/8"])},
        ) as daemon,
    ):
        yield Rig(daemon, hub)


async def until_state(admin: httpx2.AsyncClient, pull_id: str, *states: str) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        pull: dict[str, Any] = (await admin.get(f"/models/pulls/{pull_id}")).json()["pull"]
        return pull if pull["state"] in states else None

    found: dict[str, Any] = await wait_until(reached, timeout=30)
    return found


async def test_find_pull_publish_and_serve_to_nodes(rig: Rig, tiny_gguf: bytes) -> None:
    admin = rig.daemon.admin
    found = (await admin.get("/hub/search", params={"q": "tiny"})).json()
    assert [r["id"] for r in found["repos"]] == [REPO]
    async with fake_node(rig.daemon, "n1"):

        async def node_ready() -> bool:
            nodes = (await admin.get("/nodes")).json()["nodes"]
            return any(n["id"] == "n1" and n["state"] == "ready" for n in nodes)

        await wait_until(node_ready, timeout=10)
        files = (await admin.get("/hub/files", params={"repo": REPO})).json()["files"]
        assert [(f["path"], f["quantisation"], f["size"], f["fits"]) for f in files] == [
            (FILE, "Q8_0", len(tiny_gguf), True)
        ]
        assert files[0]["sha256"] == hashlib.sha256(tiny_gguf).hexdigest()

    answer = await admin.post("/models/pulls", json={"repo": REPO, "file": FILE})
    assert answer.status_code == 202, answer.text
    pull = await until_state(admin, answer.json()["pull"]["id"], "ready", "failed")
    assert pull["state"] == "ready", pull["error"]
    assert pull["bytes"] == pull["size"] == len(tiny_gguf)
    draft = pull["draft"]
    assert draft["name"] == "tiny-chat.q8_0"
    # Not live until published.
    assert (await admin.get(f"/models/{draft['name']}")).status_code == 404

    draft["name"] = "tiny"
    draft["profiles"][0]["context"] = 512
    edited = await admin.put(f"/models/pulls/{pull['id']}/draft", json=draft)
    assert edited.status_code == 200, edited.text
    draft["profiles"][0]["weights"]["sha256"] = "0" * 64
    refused = await admin.put(f"/models/pulls/{pull['id']}/draft", json=draft)
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "profiles"

    published = await admin.post(f"/models/pulls/{pull['id']}/publish")
    assert published.status_code == 201, published.text
    model = (await admin.get("/models/tiny")).json()["model"]
    assert model["profiles"][0]["context"] == 512
    # Nodes fetch the weights from control's file server (behind node credentials), as every file.
    url = model["profiles"][0]["weights"]["url"]
    assert url == f"{rig.daemon.listening.agent_url}/files/models/{FILE}"
    files = rig.daemon.fleet.files
    assert files is not None
    served = files.path("models", FILE)
    assert served is not None and served.read_bytes() == tiny_gguf
    async with httpx2.AsyncClient() as client:
        assert (await client.get(url)).status_code == 401  # not a node: refused, as for every file
    assert (await admin.get(f"/models/pulls/{pull['id']}")).json()["pull"]["state"] == "published"


async def test_progress_is_reported_while_downloading_and_a_pull_can_be_cancelled(rig: Rig) -> None:
    admin = rig.daemon.admin
    rig.hub.chunk_delay = 0.3
    pull = (await admin.post("/models/pulls", json={"repo": REPO, "file": FILE})).json()["pull"]

    async def downloading() -> dict[str, Any] | None:
        seen: dict[str, Any] = (await admin.get(f"/models/pulls/{pull['id']}")).json()["pull"]
        return seen if seen["state"] == "downloading" and seen["bytes"] >= 2 * 65536 else None

    seen = await wait_until(downloading, timeout=20)
    assert seen["rate"] > 0 and seen["eta_seconds"] is not None and seen["size"] > seen["bytes"]
    assert [p["id"] for p in (await admin.get("/models/pulls")).json()["pulls"]] == [pull["id"]]
    assert (await admin.delete(f"/models/pulls/{pull['id']}")).status_code == 204
    assert (await admin.get(f"/models/pulls/{pull['id']}")).status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"url": "https://169.254.169.254/latest/meta-data/x.gguf", "sha256": "0" * 64}, 400, "url"),
        ({"url": "https://user@hub.example/x.gguf", "sha256": "0" * 64}, 400, "url"),
        ({"repo": "acme/../../etc", "file": FILE}, 400, "repo"),
        ({"repo": REPO, "file": "nope.gguf"}, 404, "file"),
        ({"repo": REPO, "file": FILE, "unknown": True}, 400, "unknown"),
    ],
)
async def test_hostile_pull_requests_are_refused(rig: Rig, body: dict[str, Any], status: int, field: str) -> None:
    answer = await rig.daemon.admin.post("/models/pulls", json=body)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["field"] == field


async def test_a_file_too_big_for_any_node_does_not_fit(rig: Rig) -> None:
    rig.hub.claimed_sizes["huge-F16.gguf"] = HUGE
    admin = rig.daemon.admin

    async def listed() -> dict[str, Any]:
        files: list[dict[str, Any]] = (await admin.get("/hub/files", params={"repo": "acme/huge-GGUF"})).json()["files"]
        return files[0]

    assert (await listed())["fits"] is False  # no node at all
    async with fake_node(rig.daemon, "n1"):

        async def needs() -> dict[str, Any] | None:
            entry = await listed()
            return entry if "needs" in entry["fit_detail"] else None

        entry = await wait_until(needs, timeout=10)
    assert entry["fits"] is False and entry["size"] == HUGE and "node n1: needs" in entry["fit_detail"]


async def test_without_a_files_directory_pulls_are_refused_but_search_works(tmp_path: Path, tiny_gguf: bytes) -> None:
    async with (
        run_fake_hub(FakeHub(repos={REPO: FakeRepo(files={FILE: tiny_gguf})})) as hub,
        running_control(
            tmp_path, control_settings={"hub": HubConfig(endpoint=hub.url, allow_networks=["127.0.0.0/8"])}
        ) as daemon,
    ):
        assert (await daemon.admin.get("/hub/search", params={"q": ""})).status_code == 200
        answer = await daemon.admin.post("/models/pulls", json={"repo": REPO, "file": FILE})
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "no_files_dir"
