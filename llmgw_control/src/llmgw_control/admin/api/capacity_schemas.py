"""Capacity runs' bodies and answers (``capacity_routes``): a sweep asked for, and its state."""

from __future__ import annotations

from typing import Any

import attrs

from .schemas import NAME_RULES

# At most this many levels in one sweep, each at most this concurrency: a sweep is a handful of
# points on a curve, and 512 streams at once is past any one replica's batch.
MAX_LEVELS = 64
MAX_CONCURRENCY = 512
# Tokens of the fixed prompt and the fixed output (also bounded by the profile's context).
MAX_PROMPT_TOKENS = 32768
MAX_OUTPUT_TOKENS = 4096
# Seconds one level runs (new requests stop then; the run as a whole is bounded too).
MIN_LEVEL_SECONDS = 1.0
MAX_LEVEL_SECONDS = 600.0


@attrs.frozen
class CapacityRunRequest:
    model: str = attrs.field(metadata={"schema": NAME_RULES, "doc": "MODEL or MODEL:PROFILE"})
    profile: str | None = attrs.field(default=None, metadata={"schema": NAME_RULES})
    node: str | None = attrs.field(
        default=None,
        metadata={"schema": NAME_RULES, "doc": "Measure a replica on this node (one is started there if none runs)"},
    )
    levels: list[int] | None = attrs.field(
        default=None,
        metadata={
            "schema": {"maxItems": MAX_LEVELS, "items": {"minimum": 1, "maximum": MAX_CONCURRENCY}},
            "doc": "Concurrency levels, measured in increasing order (default 1, 2, 4, 8)",
        },
    )
    prompt_tokens: int = attrs.field(default=128, metadata={"schema": {"minimum": 1, "maximum": MAX_PROMPT_TOKENS}})
    output_tokens: int = attrs.field(default=64, metadata={"schema": {"minimum": 1, "maximum": MAX_OUTPUT_TOKENS}})
    level_seconds: float = attrs.field(
        default=10.0, metadata={"schema": {"minimum": MIN_LEVEL_SECONDS, "maximum": MAX_LEVEL_SECONDS}}
    )


@attrs.frozen
class CapacityLevelView:
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
    meets_objective: bool | None = attrs.field(metadata={"doc": "null: the profile sets no latency objective"})


@attrs.frozen
class CapacityRunView:
    """A run: ``state`` is queued, running, done, failed or cancelled."""

    id: str
    model: str
    profile: str
    node: str | None
    state: str
    error: str
    created_at: float
    finished_at: float | None
    levels: list[int]
    levels_done: int
    prompt_tokens: int
    output_tokens: int
    level_seconds: float
    node_id: str
    replica_id: str
    started_replica: bool
    results: list[CapacityLevelView]
    slots: int | None = attrs.field(metadata={"doc": "the slot count the run implies for the objective"})
    comparable: dict[str, Any] = attrs.field(
        metadata={"doc": "engine and version, weights sha256, profile, node facts, hardware, kind"}
    )


@attrs.frozen
class CapacityRunAnswer:
    run: CapacityRunView


@attrs.frozen
class CapacityRunList:
    runs: list[CapacityRunView]
