"""Measured capacity, and what admission and placement take from it: pure values, no I/O.

A capacity run measures one profile on one node at a sweep of concurrency levels. Its numbers
hold for every node of the same **capacity kind**: the same hardware (``measured.node_kind``: the
CPU architecture and the GPUs; plus the CPU model, which decides a CPU-bound engine's speed) and
the same engine version. Two such nodes run the same engine binary on the same silicon, so a
measurement on one predicts the other; anything else (another GPU, another engine build) is
measured on its own. A run holds for the profile as it was measured, too: its fingerprint (the
weights, context, parallel, slots, engine arguments and environment, GPUs) must match the
profile's now, so changing ``-np`` or a flag retires the numbers until measured again.

From the newest finished run of a (profile, kind):

- **slots**: the highest measured concurrency whose TTFT p99 and inter-token latency p99 meet
  the profile's ``ttft_target`` / ``itl_target`` becomes the replica's slot count for admission
  (instead of ``parallel``). A profile without targets, or a kind without a run, keeps
  ``parallel``. When even the lowest level misses the objective the slot count is 1.
- **throughput**: the best generation tokens/s among the levels that meet the objective (every
  level when the profile sets none), which placement uses to prefer, among nodes that fit, the
  hardware that serves the model faster.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from llmgw_shared.facts import HostFacts

from ..catalog import ProfileConfig
from .measured import node_kind


def hardware_of(facts: HostFacts) -> str:
    """``x86_64+1xNVIDIA L4 (AMD EPYC 7B13)``: the node kind and the CPU model, the hardware half
    of a capacity kind (placement compares nodes by it, for one engine version)."""
    return f"{node_kind(facts)} ({facts.cpu_model or 'unknown CPU'})"


def profile_fingerprint(profile: ProfileConfig) -> str:
    """What of a profile decides how fast a replica of it runs, as a short digest."""
    facts = {
        "weights": profile.weights.sha256 if profile.weights is not None else "",
        "model_dir": profile.model_dir,
        "context": profile.context,
        "parallel": profile.parallel,
        "slots": profile.slots,
        "args": list(profile.args),
        "env": dict(profile.env),
        "gpus": profile.gpus,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def capacity_kind(hardware: str, engine: str, version: str) -> str:
    """Hardware + engine version: where one run's numbers apply."""
    return f"{hardware} / {engine} {version}"


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (0 for no values): an observed value, never an interpolation."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@attrs.frozen
class LevelResult:
    """What one concurrency level measured."""

    concurrency: int
    requests: int
    errors: int
    duration_s: float
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float

    def meets(self, ttft_target: float, itl_target: float) -> bool:
        """Whether this level met the objective (a target of 0 is none); a level with no
        completed request, or with errors, meets nothing."""
        if self.requests == 0 or self.errors:
            return False
        return (not ttft_target or self.ttft_p99_s <= ttft_target) and (not itl_target or self.itl_p99_s <= itl_target)


def level_from(doc: Mapping[str, Any]) -> LevelResult:
    fields = {f.name for f in attrs.fields(LevelResult)}
    return LevelResult(**{k: v for k, v in doc.items() if k in fields})


def slots_for(levels: Iterable[LevelResult], ttft_target: float, itl_target: float) -> int | None:
    """The slot count a run implies, or None when the profile sets no objective or nothing ran."""
    measured = sorted(levels, key=lambda lv: lv.concurrency)
    if not (ttft_target or itl_target) or not measured:
        return None
    meeting = [lv.concurrency for lv in measured if lv.meets(ttft_target, itl_target)]
    return max(meeting) if meeting else 1


def best_throughput(levels: Iterable[LevelResult], ttft_target: float, itl_target: float) -> float:
    meeting = [lv.generation_tokens_per_s for lv in levels if lv.meets(ttft_target, itl_target)]
    return max(meeting, default=0.0)


@attrs.frozen
class Measured:
    """The levels of one finished run of one profile on one capacity kind."""

    profile_key: str
    hardware: str
    engine: str
    engine_version: str
    levels: tuple[LevelResult, ...]
    # ``profile_fingerprint`` of the profile measured.
    profile: str = ""

    @property
    def kind(self) -> str:
        return capacity_kind(self.hardware, self.engine, self.engine_version)


def measured_from(profile_key: str, document: Mapping[str, Any]) -> Measured | None:
    """A stored run's document (``capacity_runs``) as what the index learns; None when it is not
    the shape a finished run writes (an older or damaged row is skipped, not fatal)."""
    try:
        comparable = document["comparable"]
        levels = tuple(level_from(doc) for doc in document["results"])
        return Measured(
            profile_key,
            str(comparable["hardware"]),
            str(comparable["engine"]),
            str(comparable["engine_version"]),
            levels,
            str(comparable.get("profile_fingerprint", "")),
        )
    except (KeyError, TypeError, ValueError):
        return None


class CapacityIndex:
    """The newest finished run per (profile key, capacity kind, profile fingerprint), as admission
    and placement read it."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str, str], Measured] = {}

    def learn(self, measured: Measured) -> None:
        """Record a finished run; the caller feeds runs oldest first, so the newest wins."""
        self._runs[(measured.profile_key, measured.kind, measured.profile)] = measured

    def slots(self, profile_key: str, kind: str, fingerprint: str, ttft_target: float, itl_target: float) -> int | None:
        """The slot count measured for ``profile_key`` as it is now on ``kind``; None: keep ``parallel``."""
        measured = self._runs.get((profile_key, kind, fingerprint))
        return slots_for(measured.levels, ttft_target, itl_target) if measured else None

    def throughput(
        self, profile_key: str, engine: str, version: str, fingerprint: str, ttft_target: float, itl_target: float
    ) -> dict[str, float]:
        """Measured generation tokens/s of ``profile_key`` as it is now, per hardware, for this engine version."""
        return {
            m.hardware: best_throughput(m.levels, ttft_target, itl_target)
            for (k, _, f), m in self._runs.items()
            if k == profile_key and f == fingerprint and (m.engine, m.engine_version) == (engine, version)
        }

    def __len__(self) -> int:
        return len(self._runs)
