"""LoRA adapters on the data path: which adapter the engine applies, and the affinity id.

A replica of a profile with adapters (catalog/models.py ``AdapterConfig``) holds those its node loaded. The
engine must apply exactly the one the client's model name means, and none for the base model,
whatever the client's body says:

* llama-server (started with every adapter its node verified, each at scale 0): the request's
  ``lora`` field lists every adapter by its position at start with its scale, the asked-for one
  at its scale and all others at 0 (an adapter left out of the list would be 0 too, but an
  explicit list does not depend on that default);
* vLLM (``--enable-lora``, adapters loaded by name while it runs): the request's ``model`` is the
  adapter's name.

Either way a replica holds the adapters its node reported loaded, so a request for an adapter
goes only to replicas that have it (``without_adapter``), never to one that would answer with
the base model or a 404.

The client's own ``lora`` field is dropped either way: which adapter runs is the catalog's choice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from ..catalog import ProfileConfig
from .affinity import Affinity
from .replicas import Replica

# How a replica's engine is told the adapter (``Replica.adapter_mode``).
LORA_FIELD = "lora-field"
MODEL_NAME = "model-name"


def replica_adapters(profile: ProfileConfig, loaded: Sequence[str]) -> tuple[tuple[tuple[str, float], ...], str]:
    """What a replica of ``profile`` holds, (name, scale) in the engine's order, and its mode.

    ``loaded``: the names its node reports loaded, the only ones it holds: a vLLM replica those it
    loaded live, a llama-server those on its command line (the profile's whose files the node
    verified, in the profile's order, which is the order ``lora`` ids count in)."""
    adapters = tuple((a.name, a.scale) for a in profile.adapters if a.name in loaded)
    if not profile.adapters:
        return (), ""
    return adapters, LORA_FIELD if profile.engine == "llama.cpp" else MODEL_NAME


def without_adapter(replicas: Iterable[Replica], adapter: str | None) -> frozenset[str]:
    """The replicas a request for ``adapter`` must not go to (none for the base model): those
    that do not hold it, such as a vLLM replica whose load of it failed or has not happened yet."""
    if adapter is None:
        return frozenset()
    return frozenset(r.id for r in replicas if all(name != adapter for name, _ in r.adapters))


def adapter_fields(replica: Replica, requested: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    """What to set in the engine's body for ``requested`` on ``replica`` (None: leave the body be);
    the caller drops the client's ``lora`` whenever this is not None."""
    if replica.adapter_mode == LORA_FIELD and replica.adapters:
        return {
            "lora": [
                {"id": index, "scale": scale if name == requested else 0.0}
                for index, (name, scale) in enumerate(replica.adapters)
            ]
        }
    if replica.adapter_mode == MODEL_NAME and any(name == requested for name, _ in replica.adapters):
        return {"model": requested}
    if "lora" in payload:
        return {}
    return None


def adapter_affinity(affinity: Affinity | None, adapter: str | None) -> Affinity | None:
    """An adapter's requests are kept apart from the base's and other adapters' in prefix routing:
    the same prompt under another adapter has another KV cache, so the affinity id includes the adapter."""
    if affinity is None or adapter is None:
        return affinity
    affinity_id = hashlib.blake2b(affinity.id, digest_size=len(affinity.id), key=adapter.encode()[:64]).digest()
    return attrs.evolve(affinity, id=affinity_id)
