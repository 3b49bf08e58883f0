"""LoRA adapters of running vLLM replicas kept in step with the catalog, without restarting them.

vLLM loads and unloads adapters while it runs (the node's ``set_adapters``, which calls vLLM's
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``). When a profile's adapters change,
each ready replica of it whose node reports another set loaded is sent the catalog's list, once
per list (compared by each adapter's name and file, so one replaced under its name is
reloaded): a load that fails is reported in the replica's detail and not retried until the list
changes again or the engine restarts (the node then loads its list anew). The gateway routes an
adapter's requests only to the replicas that report it loaded (``gateway/adapters.py``).

llama-server takes its adapters at start only; a change of its list restarts its replicas
(``catalog/service.py``), so nothing here concerns it.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from llmgw_shared.wire import AdapterSpec, WeightsSpec

from ..catalog import LIVE_ADAPTER_ENGINES, Catalog, ProfileConfig
from .lifecycle import ReplicaStatus
from .replica_records import ReplicaRecord

# vLLM's --max-loras: adapters in one batch, each with GPU memory for its weights set aside at
# start (max rank x layers). A profile with many adapters still serves them all, up to this
# many at once; its own ``args`` may set another (they come after ours, and the last one wins).
DEFAULT_MAX_LORAS = 4


def adapter_specs(profile: ProfileConfig) -> list[AdapterSpec]:
    """The adapters a replica of ``profile`` is to have, as the node is told them."""
    return [AdapterSpec(a.name, WeightsSpec(a.weights.url, a.weights.sha256, a.weights.size)) for a in profile.adapters]


def lora_args(profile: ProfileConfig) -> list[str]:
    """vLLM's start flags for a profile with adapters (before the profile's own ``args``)."""
    if not profile.adapters or profile.engine != "vllm":
        return []
    return ["--enable-lora", "--max-loras", str(min(len(profile.adapters), DEFAULT_MAX_LORAS))]


@attrs.define
class LiveAdapters:
    """The lists last sent to each replica (or that it was started with), so one list is sent
    once, not on every pass."""

    sent: dict[str, tuple[AdapterSpec, ...]] = attrs.Factory(dict)

    def due(self, records: Iterable[ReplicaRecord], catalog: Catalog) -> list[tuple[ReplicaRecord, list[AdapterSpec]]]:
        """The ready replicas of live-loading profiles whose loaded adapters are not the catalog's,
        with the list to send them."""
        out: list[tuple[ReplicaRecord, list[AdapterSpec]]] = []
        present: set[str] = set()
        for record in records:
            present.add(record.replica_id)
            if record.status != ReplicaStatus.READY or record.draining:
                continue
            resolved = catalog.resolve(record.profile_key)
            if resolved is None or resolved.profile.engine not in LIVE_ADAPTER_ENGINES:
                continue
            wanted = adapter_specs(resolved.profile)
            sent = self.sent.get(record.replica_id)
            # Compared by the whole spec (name, path, sha256, size): an adapter replaced under its
            # name is sent again, and the node reloads it. A replica this daemon neither started
            # nor sent a list (adopted after a failover) has only its loaded names to compare.
            if sent == tuple(wanted) or (sent is None and {a.name for a in wanted} == set(record.adapters)):
                continue
            out.append((record, wanted))
        for gone in set(self.sent) - present:
            del self.sent[gone]
        return out

    def sent_to(self, replica_id: str, adapters: list[AdapterSpec]) -> None:
        self.sent[replica_id] = tuple(adapters)
