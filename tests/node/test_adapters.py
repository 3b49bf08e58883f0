"""LoRA adapters on the node (issue 35): fetched and verified exactly as weights, held in the
weights cache, and loaded by llama-server in the spec's order; one with a wrong digest is left
off the engine's command line and named in the replica's detail, the rest served."""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs
import httpx2
import pytest
import trio
from node.helpers import next_replica_state, replica_spec
from node.release_server import FileServer
from node.test_replicas import installed_node, served_weights

from llmgw_dev.engine_proc import free_port
from llmgw_dev.tiny_lora import TOKENS, write_adapters
from llmgw_node.config import NodeConfig
from llmgw_node.supervisor import Timing
from llmgw_shared.wire import AdapterSpec, StartReplica, StopReplica, WeightsSpec
from support.waiting import wait_until

pytestmark = pytest.mark.engine


def _served(files: FileServer, name: str, path: Path) -> WeightsSpec:
    data = path.read_bytes()
    return WeightsSpec(
        url=files.add_file(f"{name}.gguf", data), sha256=hashlib.sha256(data).hexdigest(), size=len(data)
    )


async def test_adapters_are_verified_cached_and_loaded_in_order(
    node_config: NodeConfig,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    tiny_model: Path,
    fast_timing: Timing,
    tmp_path: Path,
) -> None:
    adapters = [AdapterSpec(name, _served(files, name, path)) for name, path in write_adapters(tmp_path).items()]
    async with installed_node(node_config, files, engine_archive, fast_timing) as svc:
        # A wrong sha256 on the first adapter: refused before the engine starts, as for weights;
        # the engine starts with the other alone (its lora id 0) and the detail says why.
        wrong = attrs.evolve(adapters[0], weights=attrs.evolve(adapters[0].weights, sha256="0" * 64))
        bad_port = free_port()
        bad = attrs.evolve(
            replica_spec("lora-bad", served_weights(files, tiny_model), bad_port), adapters=[wrong, adapters[1]]
        )
        assert (await svc.handle(StartReplica(id="c0", fencing_token=1, replica=bad))).ok
        partial = await next_replica_state(svc, "lora-bad", lambda s: s.status in ("ready", "failed"))
        assert partial.status == "ready" and partial.adapters == [adapters[1].name], partial.describe()
        assert f"adapter {wrong.name} not loaded" in partial.detail and "sha256" in partial.detail, partial.detail
        words = (await trio.Path(f"/proc/{partial.pid}/cmdline").read_bytes()).split(b"\0")
        assert words[words.index(b"--lora-scaled") + 1].count(b",") == 0, words
        async with httpx2.AsyncClient(
            base_url=f"http://127.0.0.1:{bad_port}", timeout=60, headers={"authorization": f"Bearer {bad.api_key}"}
        ) as client:
            answer = await client.post(
                "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8,
                    "lora": [{"id": 0, "scale": 1.0}],
                },
            )
            assert answer.json()["choices"][0]["message"]["content"].count(TOKENS[adapters[1].name]) >= 6
        assert (await svc.handle(StopReplica(id="c9", fencing_token=1, replica_id="lora-bad"))).ok
        await next_replica_state(svc, "lora-bad", lambda s: s.status == "stopped")

        port = free_port()
        spec = attrs.evolve(replica_spec("lora-0", served_weights(files, tiny_model), port), adapters=adapters)
        assert (await svc.handle(StartReplica(id="c1", fencing_token=1, replica=spec))).ok
        ready = await next_replica_state(svc, "lora-0", lambda s: s.status in ("ready", "failed"))
        assert ready.status == "ready", (ready.describe(), ready.last_lines)
        held = {w.sha256: w for w in svc.weights.held()}
        assert all(held[a.weights.sha256].in_use for a in adapters)
        headers = {"authorization": f"Bearer {spec.api_key}"}
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as client:
            for index, adapter in enumerate(adapters):
                lora = [{"id": i, "scale": 1.0 if i == index else 0.0} for i in range(len(adapters))]
                answer = await client.post(
                    "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "lora": lora},
                )
                text = answer.json()["choices"][0]["message"]["content"]
                assert text.count(TOKENS[adapter.name]) >= 6, (adapter.name, text)
            # Loaded at scale 0: a request that names no adapter gets the base model.
            plain = await client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
            )
            text = plain.json()["choices"][0]["message"]["content"]
            assert all(text.count(c) < 6 for c in TOKENS.values()), text
        assert (await svc.handle(StopReplica(id="c2", fencing_token=1, replica_id="lora-0"))).ok
        await next_replica_state(svc, "lora-0", lambda s: s.status == "stopped")
        await wait_until(lambda: not any(w.in_use for w in svc.weights.held()), timeout=5)
        # Unused now: removable by control's GC like any model file.
        removed, kept = svc.weights.remove([a.weights.sha256 for a in adapters])
        assert sorted(removed) == sorted(a.weights.sha256 for a in adapters) and kept == []
