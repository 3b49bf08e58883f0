"""vLLM's LoRA adapters loaded and unloaded while it runs (issue 35), through the fake vLLM: the
node starts it with ``--enable-lora`` and run-time updating allowed, loads the spec's adapters
once it is ready, and ``set_adapters`` changes them without a restart; an adapter that fails to
load is reported and the engine keeps serving the others."""

from __future__ import annotations

from pathlib import Path

import attrs
import httpx2
import pytest
import trio
from node.helpers import next_replica_state
from node.test_served_engines import configured, served_config, spec

from llmgw_node.config import NodeConfig
from llmgw_node.service import open_node_service
from llmgw_node.supervisor import Timing
from llmgw_shared.wire import AdapterSpec, ReplicaState, SetAdapters, StartReplica, WeightsSpec
from support.served_engines import adapter_directory, model_directory
from support.waiting import wait_until

# Left out of the quick tier (slow: a vLLM stand-in started as a process).
pytestmark = pytest.mark.slow
__all__ = ["served_config"]  # the fixture, used by name


def _adapter(name: str, directory: Path) -> AdapterSpec:
    # A vLLM adapter is its directory on the node; sha256 and size are those of its weights file.
    return AdapterSpec(name, WeightsSpec(str(directory), "a" * 64, 64))


async def _ask(client: httpx2.AsyncClient, model: str) -> httpx2.Response:
    return await client.post(
        "/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}]}
    )


async def test_adapters_load_at_start_and_change_live_without_a_restart(
    served_config: NodeConfig,
    tmp_path: Path,
    fast_timing: Timing,
) -> None:
    roots = tmp_path / "models"
    one, two = _adapter("one", adapter_directory(roots / "one")), _adapter("two", adapter_directory(roots / "two"))
    # vLLM refuses an adapter of a rank above --max-lora-rank: the load fails, nothing else does.
    wide = _adapter("wide", adapter_directory(roots / "wide", rank=64))
    # A directory outside the node's model roots is never handed to the engine.
    outside = _adapter("outside", adapter_directory(tmp_path / "elsewhere" / "o"))
    replica = attrs.evolve(
        spec(
            "vllm",
            str(model_directory(roots / "qwen")),
            args=["--enable-lora", "--max-loras", "4", "--max-lora-rank", "16"],
        ),
        adapters=[one],
    )
    async with open_node_service(served_config, timing=fast_timing) as svc:
        await configured(svc)
        assert (await svc.handle(StartReplica(id="s", fencing_token=1, replica=replica))).ok
        ready = await next_replica_state(svc, replica.replica_id, lambda s: s.status in ("ready", "failed"))
        assert ready.status == "ready" and ready.adapters == ["one"], (ready.describe(), ready.last_lines)
        words = (await trio.Path(f"/proc/{ready.pid}/cmdline").read_bytes()).split(b"\0")
        assert b"--enable-lora" in words and b"--lora-modules" not in words
        environ = (await trio.Path(f"/proc/{ready.pid}/environ").read_bytes()).split(b"\0")
        assert b"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in environ

        headers = {"authorization": f"Bearer {replica.api_key}"}
        async with httpx2.AsyncClient(
            base_url=f"http://127.0.0.1:{replica.port}", headers=headers, timeout=30
        ) as client:
            answer = (await _ask(client, "one")).json()
            assert answer["model"] == "one" and answer["choices"][0]["message"]["content"].startswith("[lora:one]")
            assert (await _ask(client, "two")).status_code == 404  # not loaded: vLLM's 404, never the base

            # Added while it runs: loaded live, the same process.
            assert (
                await svc.handle(
                    SetAdapters(id="a", fencing_token=1, replica_id=replica.replica_id, adapters=[one, two])
                )
            ).ok
            both = await next_replica_state(svc, replica.replica_id, lambda s: s.adapters == ["one", "two"])
            assert both.status == "ready" and both.pid == ready.pid and both.detail == ""
            assert (await _ask(client, "two")).json()["choices"][0]["message"]["content"].startswith("[lora:two]")

            # Replaced under the same name (another directory, another sha256): vLLM keeps an
            # adapter by name, so the node unloads it and loads the new one, still no restart.
            newer = attrs.evolve(two, weights=WeightsSpec(str(adapter_directory(roots / "two-v2")), "b" * 64, 64))
            assert (
                await svc.handle(
                    SetAdapters(id="r", fencing_token=1, replica_id=replica.replica_id, adapters=[one, newer])
                )
            ).ok

            async def roots_now() -> dict[str, str]:
                listed = (await client.get("/v1/models")).json()["data"]
                return {m["id"]: m["root"] for m in listed if "root" in m}

            async def two_replaced() -> dict[str, str] | None:
                now = await roots_now()
                return now if now.get("two") == str((roots / "two-v2").resolve()) else None

            replaced = await wait_until(two_replaced, timeout=20)
            assert replaced["one"] == str((roots / "one").resolve()), replaced
            (current,) = [s for s in svc.replica_states() if s.replica_id == replica.replica_id]
            assert current.pid == ready.pid and current.adapters == ["one", "two"] and current.detail == ""
            # The same list again keeps it as it is.
            assert (
                await svc.handle(
                    SetAdapters(id="r2", fencing_token=1, replica_id=replica.replica_id, adapters=[one, newer])
                )
            ).ok
            assert (await roots_now()) == replaced
            two = newer

            # One removed, one that fails to load: the engine keeps serving the base and "two".
            seen: list[ReplicaState] = []
            assert (
                await svc.handle(
                    SetAdapters(id="b", fencing_token=1, replica_id=replica.replica_id, adapters=[two, wide, outside])
                )
            ).ok
            after = await next_replica_state(svc, replica.replica_id, lambda s: s.adapters == ["two"], seen=seen)
            assert after.status == "ready" and after.pid == ready.pid
            assert "adapter wide not loaded" in after.detail and "max_lora_rank" in after.detail, after.detail
            assert "adapter outside not loaded" in after.detail and "model_roots" in after.detail, after.detail
            assert (await _ask(client, "one")).status_code == 404
            assert (await _ask(client, "two")).json()["model"] == "two"
            assert (await _ask(client, "qwen-test")).json()["choices"][0]["message"]["content"].startswith("tok0")
            assert all(s.status == "ready" for s in seen)

        # Only engines that load adapters live take set_adapters; and only a running replica.
        refused = await svc.handle(SetAdapters(id="c", fencing_token=1, replica_id="nope", adapters=[one]))
        assert not refused.ok and "not running here" in refused.error
        bad_name = await svc.handle(
            SetAdapters(
                id="d", fencing_token=1, replica_id=replica.replica_id, adapters=[attrs.evolve(one, name="no/slash")]
            )
        )
        assert not bad_name.ok and "not a plain name" in bad_name.error
