"""llama.cpp's LoRA adapters through the whole stack (issue 35): control and a node as processes,
the real llama-server on the tiny model, and the two tiny adapters (tools/llmgw_dev/tiny_lora.py)
served to the node by control's files route.

An adapter added through the admin API restarts the replica with it (llama-server takes adapters
at start only); the node fetches and verifies it like weights; the gateway answers the adapter's
model name with its effect and the base's without. One added with a wrong sha256 is refused on
the node: the replica starts without it and says why, its name answers 503, the base and the
other adapter keep serving. Usage, an allow-list and a per-minute quota count the adapter model.
"""

from __future__ import annotations

import hashlib
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from llmgw_dev.build_engine import ensure_engine
from llmgw_dev.engine_proc import free_port
from llmgw_dev.tiny_lora import TOKENS, write_adapters
from support.fleet import Daemon, Fleet, model_entry, place_files, write_control_config
from support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow]
ADAPTERS = "/models/tiny/profiles/cpu/adapters"


@pytest.fixture(scope="module")
def engine_archive(llama_server_binary: Path) -> Path:
    return ensure_engine()


@asynccontextmanager
async def _fleet(root: Path, tiny_model: Path, engine_archive: Path) -> AsyncIterator[Fleet]:
    """Control with no models in its file (the admin API refuses to edit those) and one node."""
    place_files(root, engine_archive, tiny_model)
    fleet = Fleet(root, free_port(), free_port(), free_port(), Daemon("control", [], root / "control.log"))
    config = write_control_config(root, fleet, [])
    fleet.control.argv = [str(fleet.bin_dir / "llmgw-control"), "run", "--config", str(config)]
    try:
        await fleet.start_control()
        await fleet.add_node("n1")
        yield fleet
    finally:
        with trio.CancelScope(shield=True):
            for node in fleet.nodes.values():
                await node.stop(signal.SIGKILL)
            await fleet.control.stop(signal.SIGKILL)
            fleet.kill_engines()


def _adapter(fleet: Fleet, name: str, path: Path, *, sha256: str = "") -> dict[str, Any]:
    data = path.read_bytes()
    return {
        "name": name,
        "url": f"{fleet.agent_url}/files/models/{path.name}",
        "sha256": sha256 or hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }


async def _ask(client: httpx2.AsyncClient, model: str, key: str = "") -> httpx2.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return await client.post(
        "/v1/chat/completions",
        headers=headers,
        json={"model": model, "messages": [{"role": "user", "content": "Say something"}], "max_tokens": 8},
    )


def _marked(answer: httpx2.Response) -> str | None:
    """The adapter whose token makes up the answer, None for the base model's."""
    assert answer.status_code == 200, answer.text
    text: str = answer.json()["choices"][0]["message"]["content"]
    return next((name for name, char in TOKENS.items() if text.count(char) >= 6), None)


async def _loaded_on(admin: httpx2.AsyncClient) -> dict[str, list[str]]:
    listed = (await admin.get(ADAPTERS)).json()["adapters"]
    return {a["name"]: a["loaded_on"] for a in listed}


async def _ready_replica(admin: httpx2.AsyncClient) -> dict[str, Any] | None:
    replicas = (await admin.get("/replicas")).json()["replicas"]
    return next((r for r in replicas if r["status"] == "ready"), None)


async def test_an_adapter_added_through_the_admin_api_is_served_by_the_real_engine(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    files = write_adapters(tmp_path / "lora")
    async with (
        _fleet(tmp_path, tiny_model, engine_archive) as fleet,
        httpx2.AsyncClient(base_url=fleet.admin_url + "/api/v1", timeout=30) as admin,
        httpx2.AsyncClient(base_url=fleet.api_url, timeout=120) as client,
    ):
        for path in files.values():
            (tmp_path / "files" / "models" / path.name).write_bytes(path.read_bytes())
        added = await admin.post("/models", json=model_entry("tiny", tiny_model, fleet.agent_url, min_replicas=1))
        assert added.status_code == 201, added.text
        first = await wait_until(lambda: _ready_replica(admin), timeout=60)
        assert _marked(await _ask(client, "tiny")) is None

        # Added: the replica restarts with it (fetched from control, verified), and it is served.
        x = await admin.post(ADAPTERS, json=_adapter(fleet, "tiny-lora-x", files["tiny-lora-x"]))
        assert x.status_code == 201, x.text

        async def x_loaded() -> list[str]:
            return (await _loaded_on(admin)).get("tiny-lora-x", [])

        (holder,) = await wait_until(x_loaded, timeout=60)
        assert holder != first["id"], "llama-server cannot load an adapter while it runs: a new replica"
        assert _marked(await _ask(client, "tiny-lora-x")) == "tiny-lora-x"
        assert _marked(await _ask(client, "tiny")) is None

        # Added with a wrong sha256: refused on the node; the replica starts without it and says why.
        bad = _adapter(fleet, "tiny-lora-q", files["tiny-lora-q"], sha256="0" * 64)
        assert (await admin.post(ADAPTERS, json=bad)).status_code == 201

        async def refused() -> dict[str, Any] | None:
            replica = await _ready_replica(admin)
            return replica if replica and "adapter tiny-lora-q not loaded" in replica["detail"] else None

        replica = await wait_until(refused, timeout=60)
        assert "sha256" in replica["detail"], replica
        assert await _loaded_on(admin) == {"tiny-lora-x": [replica["id"]], "tiny-lora-q": []}
        answer = await _ask(client, "tiny-lora-q")
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "no_replica_available", answer.text
        assert _marked(await _ask(client, "tiny")) is None
        assert _marked(await _ask(client, "tiny-lora-x")) == "tiny-lora-x"

        # Usage is counted under each adapter's model name.
        usage = (await admin.get("/usage", params={"model": "tiny-lora-x"})).json()
        assert usage["totals"]["requests"] == 2 and usage["totals"]["completion_tokens"] == 16, usage
        assert (await admin.get("/usage", params={"model": "tiny-lora-q"})).json()["totals"]["requests"] == 0

        # A key allowed only the adapter model calls it and not its base; its group's quota counts it.
        group = (await admin.post("/groups", json={"name": "team"})).json()["group"]["id"]
        made = await admin.post("/keys", json={"name": "app", "group_id": group, "models": ["tiny-lora-x"]})
        assert made.status_code == 201, made.text
        key, key_id = made.json()["secret"], made.json()["key"]["id"]
        assert (await admin.put(f"/groups/{group}/quota", json={"requests_per_minute": 2})).status_code == 200
        assert _marked(await _ask(client, "tiny-lora-x", key)) == "tiny-lora-x"
        base = await _ask(client, "tiny", key)
        assert base.status_code == 403 and "may not use the model 'tiny'" in base.json()["error"]["message"], base.text
        assert _marked(await _ask(client, "tiny-lora-x", key)) == "tiny-lora-x"
        over = await _ask(client, "tiny-lora-x", key)
        assert over.status_code == 429, over.text
        mine = (await admin.get("/usage", params={"key_id": key_id})).json()
        assert {(u["model"], u["requests"]) for u in mine["usage"]} == {("tiny-lora-x", 2)}, mine
