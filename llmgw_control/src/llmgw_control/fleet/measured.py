"""What replicas were measured to use, remembered per (profile, node kind) to correct the next claim.

A claim estimated from a GGUF header is a guess (the KV cache, the compute buffers, what the
engine offloads to a GPU); what a node measured a replica of the profile to hold is not. The
largest measurement seen while replicas of a profile ran on nodes of one kind becomes that
profile's claim on that kind: the largest, because a replica's use grows with the context it
has filled, and a claim must cover a replica at its busiest rather than at rest. A claim the
operator configured (``ram_mib``) is a floor: the reconciler never accounts less than it.

Nodes are of one kind when they run a profile alike: the same CPU architecture and the same GPUs
(a model offloaded to a GPU holds little RAM; the same model on a CPU-only node holds it all).
"""

from __future__ import annotations

from llmgw_shared.facts import HostFacts

from ..catalog import Claim


def node_kind(facts: HostFacts) -> str:
    """``x86_64``, ``x86_64+2xNVIDIA L4``: what decides how a profile's memory is spread."""
    gpus: dict[str, int] = {}
    for gpu in facts.gpus:
        gpus[gpu.name] = gpus.get(gpu.name, 0) + 1
    return "+".join([facts.arch or "unknown", *(f"{n}x{name}" for name, n in sorted(gpus.items()))])


class MeasuredUse:
    """The largest measured use of one replica per (profile key, node kind)."""

    def __init__(self) -> None:
        self._peak: dict[str, dict[str, Claim]] = {}

    def record(self, profile_key: str, kind: str, used: Claim) -> None:
        kinds = self._peak.setdefault(profile_key, {})
        old = kinds.get(kind)
        kinds[kind] = used if old is None else Claim(max(old.ram_mib, used.ram_mib), max(old.vram_mib, used.vram_mib))

    def by_kind(self, profile_key: str) -> dict[str, Claim]:
        return dict(self._peak.get(profile_key, {}))

    def forget(self, profile_key: str) -> None:
        """The profile changed (or went): what its old form used says nothing about the new one."""
        self._peak.pop(profile_key, None)
