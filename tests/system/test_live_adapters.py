"""vLLM's LoRA adapters end to end (issue 35): control in-process, a node daemon running the fake
vLLM; adapters added and removed through the admin API load and unload in the running replica
(same replica, same engine process), the gateway sends each adapter's name to it, and one that
fails to load is reported while the others are served."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import openai
import pytest
import tomli_w
from control.admin.conftest import JOIN_TOKEN, running_control, wait_until

from llmgw_control.catalog import EngineConfig
from support.fleet import BIN, Daemon
from support.served_engines import VERSIONS, adapter_directory, engines_config, model_directory

pytestmark = pytest.mark.slow


def _adapter(name: str, directory: Path) -> dict[str, Any]:
    return {"name": name, "url": str(directory), "sha256": "e" * 64, "size": 64}


async def test_adapters_added_through_the_admin_api_load_live_and_are_routed(tmp_path: Path) -> None:
    roots = tmp_path / "models"
    base = model_directory(roots / "qwen")
    one, two = adapter_directory(roots / "one"), adapter_directory(roots / "two")
    wide = adapter_directory(roots / "wide", rank=64)
    profile = {
        "name": "gpu",
        "engine": "vllm",
        "model_dir": str(base),
        "ram_mib": 100,
        "context": 4096,
        "min_replicas": 1,
        "start_timeout": 30.0,
        "adapters": [{"name": "one", "weights": {"url": str(one), "sha256": "e" * 64, "size": 64}}],
    }
    engines = [EngineConfig("vllm", VERSIONS["vllm"])]
    async with running_control(tmp_path / "control", control_settings={"engines": engines}) as d:
        added = await d.admin.post("/models", json={"name": "qwen", "profiles": [profile]})
        assert added.status_code == 201, added.text
        config = {
            "control": [d.agent_url],
            "token": JOIN_TOKEN,
            "node_id": "n1",
            "data_dir": str(tmp_path / "node"),
            "reconnect_min_s": 0.2,
            "reconnect_max_s": 1.0,
            "engines": engines_config(tmp_path / "bin"),
            "model_roots": [str(roots)],
        }
        (tmp_path / "node.toml").write_text(tomli_w.dumps(config))
        node = Daemon(
            "n1",
            [str(BIN / "llmgw-node"), "run", "--stop-engines", "--config", str(tmp_path / "node.toml")],
            tmp_path / "node.log",
        )
        await node.start()
        try:
            client = openai.AsyncOpenAI(base_url=d.listening.api_url + "/v1", api_key="none", max_retries=0, timeout=60)

            async def ask(model: str) -> str:
                reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
                return reply.choices[0].message.content or ""

            assert (await ask("one")).startswith("[lora:one]")  # the adapter loaded at the start
            assert (await ask("qwen")).startswith("tok0")  # the base: no adapter
            (replica,) = (await d.admin.get("/replicas")).json()["replicas"]

            async def listed() -> dict[str, Any]:
                answer: dict[str, Any] = (await d.admin.get("/models/qwen/profiles/gpu/adapters")).json()
                return {a["name"]: a["loaded_on"] for a in answer["adapters"]}

            assert await listed() == {"one": [replica["id"]]}

            # Added through the admin API: loaded into the running replica, no restart.
            path = "/models/qwen/profiles/gpu/adapters"
            assert (await d.admin.post(path, json=_adapter("two", two))).status_code == 201

            async def two_loaded() -> bool:
                return (await listed()).get("two") == [replica["id"]]

            await wait_until(two_loaded, timeout=20)
            assert (await ask("two")).startswith("[lora:two]")
            (same,) = (await d.admin.get("/replicas")).json()["replicas"]
            assert same["id"] == replica["id"] and same["status"] == "ready"
            assert node.log().count("starting: vllm started") == 1, "the engine was started again"

            # One that fails to load (its rank is above vLLM's limit): reported, the rest served.
            assert (await d.admin.post(path, json=_adapter("wide", wide))).status_code == 201

            async def reported() -> bool:
                (r,) = (await d.admin.get("/replicas")).json()["replicas"]
                return "adapter wide not loaded" in r["detail"]

            await wait_until(reported, timeout=20)
            assert (await listed())["wide"] == []
            with pytest.raises(openai.APIStatusError) as refused:
                await ask("wide")
            assert refused.value.status_code == 503
            assert (await ask("two")).startswith("[lora:two]") and (await ask("one")).startswith("[lora:one]")

            # Removed: unloaded live, and the name is no longer served.
            assert (await d.admin.delete(f"{path}/one")).status_code == 204
            with pytest.raises(openai.NotFoundError):
                await ask("one")

            async def one_unloaded() -> bool:
                return "one" not in (await listed())

            await wait_until(one_unloaded, timeout=20)
            (last,) = (await d.admin.get("/replicas")).json()["replicas"]
            assert last["id"] == replica["id"]
            assert node.log().count("starting: vllm started") == 1, "the engine was started again"
            assert (await ask("two")).startswith("[lora:two]")
        finally:
            await node.stop(signal.SIGTERM)
