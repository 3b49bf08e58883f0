"""A replica's LoRA adapters on the node: what a spec may name, and which cache files it holds.

llama.cpp adapters are GGUF files of the weights cache (fetched and verified exactly as weights
by ``weights.WeightsCache``, held while the replica runs, removed by control's GC when unused);
a vLLM adapter is a directory on the node, checked like a model_dir.
"""

from __future__ import annotations

import re

from llmgw_node.model_dirs import ModelDirError, check_model_dir
from llmgw_shared.wire import ReplicaSpec, WeightsSpec


class AdapterError(Exception):
    """A spec's adapters cannot be used; the text says why."""


# Adapters one replica may load: control's catalog allows this many a profile (MAX_ADAPTERS).
MAX_ADAPTERS = 64
_ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,95}$")


def check_adapters(spec: ReplicaSpec) -> None:
    """A spec's adapters, checked before anything is fetched: their names reach the engine (vLLM's
    lora_name) and logs, their files the cache (by digest)."""
    if not spec.adapters:
        return
    if spec.engine not in ("llama.cpp", "vllm"):
        raise AdapterError(f"replica {spec.replica_id}: {spec.engine} does not load LoRA adapters here")
    if len(spec.adapters) > MAX_ADAPTERS:
        raise AdapterError(f"replica {spec.replica_id}: at most {MAX_ADAPTERS} adapters")
    for adapter in spec.adapters:
        if not _ADAPTER_NAME.fullmatch(adapter.name):
            raise AdapterError(f"replica {spec.replica_id}: adapter name {adapter.name[:100]!r} is not a plain name")
        local = adapter.weights.url.removeprefix("file://")
        if spec.engine == "llama.cpp" and local.startswith("/") and any(c in local for c in ",:"):
            raise AdapterError(
                f"replica {spec.replica_id}: adapter {adapter.name}: a path on the node may not hold "
                "',' or ':' (llama-server's --lora-scaled separators)"
            )
        if spec.engine == "vllm":
            try:
                check_model_dir(adapter.weights.url.removeprefix("file://"))
            except ModelDirError as exc:
                raise AdapterError(f"replica {spec.replica_id}: adapter {adapter.name}: {exc}") from None


def replica_files(spec: ReplicaSpec) -> list[WeightsSpec]:
    """The cached files a replica uses: its weights and its adapters' (a vLLM adapter's directory
    is the operator's, named by path, and held in the cache no more than a model_dir is)."""
    files = [spec.weights] if spec.weights is not None else []
    if spec.engine == "llama.cpp":
        files += [a.weights for a in spec.adapters]
    return files
