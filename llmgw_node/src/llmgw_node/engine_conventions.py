"""How each engine is started: its command line and where its key goes.

- llama.cpp: ``llama-server -m FILE --host H --port P [GPU offload and split] [--lora-scaled
  A:0,B:0...] ...``, the key in ``LLAMA_API_KEY``;
- vLLM: ``vllm serve DIR --host H --port P ...``, the key in ``VLLM_API_KEY``; LoRA adapters
  (control's args carry ``--enable-lora``) are loaded at run time (``live_adapters.py``), so
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` is set for a spec with adapters;
- SGLang: ``<python> -m sglang.launch_server --model-path DIR --host H --port P --api-key K ...``
  (the configured path is the Python that has sglang installed);
- any other engine named by path: its ``args`` with ``{model}``, ``{host}`` and ``{port}``
  substituted, the key in ``LLMGW_API_KEY`` (and ``VLLM_API_KEY``, for vLLM-based builds).

Control's arguments for the profile (context, slots, served name) follow ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llmgw_shared.wire import ReplicaSpec

# Engines that serve a model directory (ReplicaSpec.model_dir) rather than one file.
DIRECTORY_ENGINES = ("vllm", "sglang")
# Engines that load and unload LoRA adapters while they run (``set_adapters``); llama-server
# takes its adapters on its command line only, so a changed list restarts it.
LIVE_ADAPTER_ENGINES = ("vllm",)


def loads_adapters_live(engine: str) -> bool:
    return engine in LIVE_ADAPTER_ENGINES


def engine_argv(binary: Path, spec: ReplicaSpec, model: Path, host: str, adapters: Sequence[Path] = ()) -> list[str]:
    """``adapters``: the verified files of ``spec.adapters``, in their order."""
    host_port = ["--host", host, "--port", str(spec.port)]
    if spec.engine == "llama.cpp":
        loras = ["--lora-scaled", lora_list(adapters)] if adapters else []
        return [str(binary), "-m", str(model), *host_port, *gpu_args(spec.devices), *loras, *spec.args]
    if spec.engine == "vllm":
        # Its adapters are loaded once it is ready, by name (live_adapters.py), not here: the
        # same path then serves a start, a restart and an adapter added while it runs.
        return [str(binary), "serve", str(model), *host_port, *spec.args]
    if spec.engine == "sglang":
        # SGLang reads its key only from --api-key: on its command line, where local users can
        # read it (docs/node.md says so; the key opens only this one engine).
        return [
            str(binary),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(model),
            *host_port,
            "--api-key",
            spec.api_key,
            *spec.args,
        ]
    subst = {"{model}": str(model), "{host}": host, "{port}": str(spec.port)}
    return [str(binary), *(subst.get(a, a) for a in spec.args)]


def lora_list(adapters: Sequence[Path]) -> str:
    """llama-server's ``--lora-scaled`` value: every adapter, in the spec's order (a request
    selects one by this position), at scale 0, so a request that names none gets the base model.
    (b11312 keeps a plain ``--lora`` at scale 1 even with ``--lora-init-without-apply``, and takes
    one ``--lora`` flag given twice as its last only; one comma-separated list is its form.)"""
    for path in adapters:
        if "," in str(path) or ":" in str(path):
            raise ValueError(f"adapter path {str(path)[:200]!r} has a ',' or ':' (llama-server's separators)")
    return ",".join(f"{path}:0" for path in adapters)


def gpu_args(devices: list[int]) -> list[str]:
    """llama-server's flags for the GPUs of a replica (before the profile's own, which may override):
    every layer offloaded, and with several GPUs the layers split evenly over them. Indices are
    the visible devices' (CUDA_VISIBLE_DEVICES renumbers them from 0)."""
    if not devices:
        return []
    # Log verbosity 4: since about b7000 llama-server logs the model load ("load_tensors: offloaded
    # N/M layers to GPU", the devices used) only from verbosity 4 up, and the node reads that line
    # to prove a GPU replica is on its GPUs (llmgw_node.offload). The cost: about 35 more log lines
    # per request, bounded by the log's rotation.
    args = ["--n-gpu-layers", "999", "--main-gpu", "0", "--log-verbosity", "4"]
    if len(devices) > 1:
        args += ["--split-mode", "layer", "--tensor-split", ",".join("1" for _ in devices)]
    return args


def key_environment(spec: ReplicaSpec) -> dict[str, str]:
    """The key by environment, not argv where the engine allows it: /proc/<pid>/cmdline is world-readable.

    Applied after the profile's ``env``, so a profile cannot give the engine another key than
    the one the gateway sends.
    """
    if spec.engine == "llama.cpp":
        return {"LLAMA_API_KEY": spec.api_key}
    live = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if spec.adapters and loads_adapters_live(spec.engine) else {}
    return {"LLMGW_API_KEY": spec.api_key, "VLLM_API_KEY": spec.api_key, **live}
