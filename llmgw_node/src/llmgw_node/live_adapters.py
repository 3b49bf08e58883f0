"""LoRA adapters loaded into and out of a running engine (vLLM), without restarting it.

vLLM started with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` loads an
adapter with ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` and drops one with
``POST /v1/unload_lora_adapter {"lora_name"}``; a request then selects it by ``model`` =
``lora_name``. The node brings a ready replica to its spec's list each time the engine becomes
ready (a restarted engine has lost what was loaded into it) and when control sends
``set_adapters``. An adapter that fails to load is left out, its reason reported in the replica's
detail, and the engine keeps serving the base model and the others.

llama-server cannot gain an adapter while it runs (``--lora`` at start only): its adapters are
on its command line and a changed list restarts it (control decides that; see
``engine_conventions.loads_adapters_live``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import httpx2
import trio

from llmgw_node.engine_http import base_url
from llmgw_shared.wire import AdapterSpec

# One load: vLLM reads the adapter's safetensors from disk and checks it against the model; a
# large adapter on a slow disk takes seconds, a minute means the engine is stuck.
LOAD_LIMIT_S = 60.0
# Unloading only drops it from the engine's tables.
UNLOAD_LIMIT_S = 10.0
# The engine's reason, as much of it as the replica's detail carries for one adapter.
REASON_CHARS = 300
# Loads and unloads in flight across the node's engines: each reads a file and holds a
# connection; a profile change reaching many replicas at once must not pile them up.
LIMITER = trio.CapacityLimiter(4)


@attrs.frozen
class Applied:
    """What a replica's engine holds after an apply (each as it was loaded, for the next apply to
    compare), which of them requests may be sent to (in the spec's order), and why the others not."""

    held: list[AdapterSpec]
    loaded: list[str]
    problems: list[str]


def adapter_path(adapter: AdapterSpec) -> str:
    """Where vLLM reads the adapter: its directory on the node (the spec's URL)."""
    return adapter.weights.url.removeprefix("file://")


async def apply(
    client: httpx2.AsyncClient,
    host: str,
    port: int,
    api_key: str,
    wanted: Sequence[AdapterSpec],
    held: Sequence[AdapterSpec],
) -> Applied:
    """Unload what ``wanted`` no longer names or names with another file (path, sha256 or size:
    vLLM keeps an adapter by name, so a replaced one is unloaded and loaded again), then load
    what ``wanted`` names and the engine lacks."""
    base = base_url(host, port)
    headers = {"Authorization": f"Bearer {api_key}"}
    by_name = {a.name: a for a in wanted}
    keep: dict[str, AdapterSpec] = {}
    stale: dict[str, AdapterSpec] = {}
    problems: list[str] = []
    for adapter in held:
        current = by_name.get(adapter.name)
        if current is not None and current.weights == adapter.weights:
            keep[adapter.name] = adapter
            continue
        problem = await _post(
            client, f"{base}/v1/unload_lora_adapter", headers, {"lora_name": adapter.name}, UNLOAD_LIMIT_S, gone_ok=True
        )
        if problem:
            # Still loaded (with its old file): no request is sent to it, the next apply tries again.
            stale[adapter.name] = adapter
            problems.append(f"adapter {adapter.name} not unloaded: {problem}")
    for adapter in wanted:
        if adapter.name in keep or adapter.name in stale:
            continue
        problem = await _post(
            client,
            f"{base}/v1/load_lora_adapter",
            headers,
            {"lora_name": adapter.name, "lora_path": adapter_path(adapter)},
            LOAD_LIMIT_S,
            gone_ok=False,
        )
        if problem:
            problems.append(f"adapter {adapter.name} not loaded: {problem}")
        else:
            keep[adapter.name] = adapter
    loaded = [a.name for a in wanted if a.name in keep]
    return Applied([*(keep[name] for name in loaded), *stale.values()], loaded, problems)


async def _post(
    client: httpx2.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict[str, str],
    limit_s: float,
    *,
    gone_ok: bool,
) -> str:
    """One call; "" when it did what was asked (or it was already so), else why not."""
    async with LIMITER:
        try:
            resp = await client.post(url, headers=headers, json=body, timeout=limit_s)
        except httpx2.TimeoutException:
            return f"no answer within {limit_s:g} s"
        except httpx2.HTTPError as exc:
            return f"{type(exc).__name__}: {str(exc)[:REASON_CHARS]}"
    if resp.status_code == 200:
        return ""
    text = resp.text[:REASON_CHARS].strip()
    # vLLM answers 400 "... has already been loaded" (an adopted engine, a repeated command) and
    # 404 "... cannot be found" for an adapter it does not hold: both are the state asked for.
    if resp.status_code == 400 and "already been loaded" in text and not gone_ok:
        return ""
    if resp.status_code == 404 and gone_ok:
        return ""
    return f"HTTP {resp.status_code}: {text or '(no reason given)'}"
