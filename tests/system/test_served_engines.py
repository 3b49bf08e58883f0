"""vLLM and SGLang end to end: control in-process, a node daemon whose [[engines]] name fakes that
speak their command lines, health and metrics; requests through the gateway, and a drain that
waits for the request in flight (issue 19)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import tomli_w
import trio
from control.admin.conftest import JOIN_TOKEN, running_control, wait_until

from llmgw_control.catalog import EngineConfig
from support.fleet import BIN, Daemon
from support.served_engines import VERSIONS, engines_config, hub_snapshot, model_directory

pytestmark = pytest.mark.slow
SLOW_TOKENS = {"FAKE_ENGINE_CHUNKS": "20", "FAKE_ENGINE_CHUNK_DELAY": "0.1"}


def profile(engine: str, model_dir: str) -> dict[str, Any]:
    return {
        "name": "gpu",
        "engine": engine,
        "model_dir": model_dir,
        "ram_mib": 100,
        "context": 4096,
        "parallel": 4,
        "env": SLOW_TOKENS,
        "start_timeout": 30.0,
    }


async def test_vllm_and_sglang_serve_through_the_gateway_and_drain_waits_for_requests(tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    local = model_directory(tmp_path / "models" / "qwen")
    hub = hub_snapshot(node_dir / "hub", "Qwen/Qwen2.5-0.5B-Instruct")
    models = [
        {"name": "qwen-vllm", "profiles": [profile("vllm", str(local))]},
        {"name": "qwen-sglang", "profiles": [profile("sglang", hub)]},
    ]
    engines = [EngineConfig(name, version) for name, version in VERSIONS.items()]
    async with running_control(tmp_path / "control", models=models, control_settings={"engines": engines}) as d:
        config = {
            "control": [d.agent_url],
            "token": JOIN_TOKEN,
            "node_id": "n1",
            "data_dir": str(node_dir),
            "reconnect_min_s": 0.2,
            "reconnect_max_s": 1.0,
            "engines": engines_config(tmp_path / "bin"),
            "model_roots": [str(tmp_path / "models")],
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
            for model in ("qwen-vllm", "qwen-sglang"):
                # A cold start: the activator holds the request until the engine is ready.
                reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
                assert reply.model == model and reply.usage is not None and reply.usage.completion_tokens == 20

            # The engine's lines through the admin API (issue 19's logs, here from a vLLM replica).
            replicas = (await d.admin.get("/replicas")).json()["replicas"]
            vllm_replica = next(r for r in replicas if r["model"] == "qwen-vllm:gpu")
            logs = (await d.admin.get(f"/replicas/{vllm_replica['id']}/logs")).json()
            assert any("Uvicorn running" in line for line in logs["lines"]), logs

            # A stream in flight, then the node drained: both replicas stop, and only after the
            # stream got every token. Draining read the engines' own metrics to see it.
            chunks: list[str] = []
            finished = trio.Event()

            async def stream() -> None:
                async with (
                    httpx2.AsyncClient(timeout=60) as http,
                    http.stream(
                        "POST",
                        d.listening.api_url + "/v1/chat/completions",
                        json={"model": "qwen-vllm", "stream": True, "messages": [{"role": "user", "content": "x"}]},
                    ) as response,
                ):
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            chunks.append(line[6:])
                finished.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream)
                await wait_until(lambda: chunks, timeout=20, interval=0.02)
                drained = await d.admin.post("/nodes/n1/drain")
                assert drained.status_code == 200, drained.text

                async def vllm_stopped() -> bool:
                    models_now = {m["key"]: m for m in (await d.admin.get("/models")).json()["models"]}
                    return not models_now["qwen-vllm:gpu"]["replicas"]

                await wait_until(vllm_stopped, timeout=30)
                assert finished.is_set(), "the replica stopped before its request finished"
            assert chunks[-1] == "[DONE]"
            contents = [json.loads(c)["choices"][0]["delta"].get("content") for c in chunks[:-1] if c]
            assert len([c for c in contents if c]) == 20
            assert "waiting for 1 request(s) in flight" in node.log()
        finally:
            await node.stop(signal.SIGTERM)
