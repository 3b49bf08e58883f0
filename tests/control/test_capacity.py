"""Measured capacity as pure values: percentiles, the objective, the slot count a run implies,
the index admission and placement read, placement preferring the faster hardware, and the
profile's objective checked at start."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from llmgw_control.catalog import ProfileConfig, WeightsConfig
from llmgw_control.config import load_config
from llmgw_control.fleet.capacity import (
    CapacityIndex,
    LevelResult,
    Measured,
    best_throughput,
    measured_from,
    percentile,
    profile_fingerprint,
    slots_for,
)
from llmgw_control.fleet.plan import Claim, Demand, PlanNode, Start, plan
from llmgw_shared.config import ConfigError
from llmgw_shared.wire import EngineState

ENGINE = ("llama.cpp", "b11312")


def level(
    concurrency: int, ttft: float, itl: float = 0.01, tps: float = 10.0, errors: int = 0, requests: int = 10
) -> LevelResult:
    return LevelResult(concurrency, requests, errors, 1.0, tps, tps, ttft / 2, ttft, itl / 2, itl)


def test_percentile_is_an_observed_value() -> None:
    assert percentile([], 0.99) == 0.0
    assert percentile([3.0], 0.5) == 3.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0 and percentile(values, 1.0) == 100.0


def test_slots_are_the_highest_level_meeting_the_objective() -> None:
    levels = [level(1, 0.05), level(2, 0.08), level(4, 0.6), level(8, 1.2)]
    assert slots_for(levels, 0.25, 0.0) == 2
    assert slots_for(levels, 2.0, 0.0) == 8
    # An inter-token objective alone, and both together (both must hold).
    assert slots_for([level(1, 0.05, itl=0.02), level(2, 0.05, itl=0.2)], 0.0, 0.1) == 1
    assert slots_for([level(1, 0.3, itl=0.02), level(2, 0.1, itl=0.02)], 0.25, 0.1) == 2
    # Nothing meets it: one slot (the replica still serves, one request at a time).
    assert slots_for([level(1, 0.5)], 0.25, 0.0) == 1
    # No objective, or nothing measured: no opinion (parallel stays).
    assert slots_for(levels, 0.0, 0.0) is None
    assert slots_for([], 0.25, 0.0) is None
    # A level with errors or without a completed request meets nothing.
    assert slots_for([level(1, 0.05), level(2, 0.05, errors=1)], 0.25, 0.0) == 1
    assert slots_for([level(1, 0.05), level(2, 0.0, requests=0)], 0.25, 0.0) == 1


def test_best_throughput_counts_only_levels_meeting_the_objective() -> None:
    levels = [level(1, 0.05, tps=10), level(4, 0.1, tps=30), level(8, 1.0, tps=50)]
    assert best_throughput(levels, 0.25, 0.0) == 30
    assert best_throughput(levels, 0.0, 0.0) == 50


def test_the_index_keeps_the_newest_run_per_kind_and_compares_hardware_per_engine_version() -> None:
    index = CapacityIndex()
    index.learn(Measured("m:cpu", "x86_64 (A)", "llama.cpp", "b1", (level(4, 0.1),), "p1"))
    index.learn(Measured("m:cpu", "x86_64 (A)", "llama.cpp", "b1", (level(2, 0.1), level(4, 0.9)), "p1"))
    index.learn(Measured("m:cpu", "x86_64 (B)", "llama.cpp", "b1", (level(8, 0.1, tps=99),), "p1"))
    index.learn(Measured("m:cpu", "x86_64 (C)", "llama.cpp", "b2", (level(8, 0.1, tps=500),), "p1"))
    assert index.slots("m:cpu", "x86_64 (A) / llama.cpp b1", "p1", 0.25, 0.0) == 2  # the newer run
    assert index.slots("m:cpu", "x86_64 (Z) / llama.cpp b1", "p1", 0.25, 0.0) is None
    assert index.throughput("m:cpu", "llama.cpp", "b1", "p1", 0.25, 0.0) == {"x86_64 (A)": 10.0, "x86_64 (B)": 99.0}
    # The profile changed since (another -np, another flag): its old numbers no longer apply.
    assert index.slots("m:cpu", "x86_64 (A) / llama.cpp b1", "p2", 0.25, 0.0) is None
    assert index.throughput("m:cpu", "llama.cpp", "b1", "p2", 0.25, 0.0) == {}


def test_the_profile_fingerprint_changes_with_what_decides_speed_only() -> None:
    base = ProfileConfig("cpu", weights=WeightsConfig("/m.gguf", "a" * 64, 1), parallel=4, args=["-t", "2"])
    same = [
        attrs.evolve(
            base,
            min_replicas=2,
            max_replicas=5,
            idle_timeout=60.0,
            labels={"zone": "a"},
            ttft_target=1.0,
            start_timeout=5.0,
        )
    ]
    other = [
        attrs.evolve(base, parallel=8),
        attrs.evolve(base, args=["-t", "4"]),
        attrs.evolve(base, context=8192),
        attrs.evolve(base, weights=WeightsConfig("/m.gguf", "b" * 64, 1)),
        attrs.evolve(base, env={"X": "1"}),
        attrs.evolve(base, slots=16),
        attrs.evolve(base, gpus=2),
    ]
    assert {profile_fingerprint(p) for p in same} == {profile_fingerprint(base)}
    assert len({profile_fingerprint(p) for p in [base, *other]}) == 1 + len(other)


def test_a_stored_document_that_is_not_a_finished_run_is_skipped() -> None:
    assert measured_from("m:cpu", {}) is None
    assert measured_from("m:cpu", {"comparable": {"hardware": "h"}, "results": []}) is None
    assert (
        measured_from(
            "m:cpu",
            {"comparable": {"hardware": "h", "engine": "e", "engine_version": "v"}, "results": [{"concurrency": "x"}]},
        )
        is None
    )
    found = measured_from(
        "m:cpu",
        {
            "comparable": {"hardware": "h", "engine": "e", "engine_version": "v"},
            "results": [
                {
                    f: 1
                    for f in (
                        "concurrency",
                        "requests",
                        "errors",
                        "duration_s",
                        "prompt_tokens_per_s",
                        "generation_tokens_per_s",
                        "ttft_p50_s",
                        "ttft_p99_s",
                        "itl_p50_s",
                        "itl_p99_s",
                    )
                }
            ],
        },
    )
    assert found is not None and found.kind == "h / e v"


def _node(node_id: str, hardware: str, ram: int = 8000) -> PlanNode:
    installed = {ENGINE: EngineState(*ENGINE, "installed")}
    return PlanNode(node_id, "ready", False, {}, installed, ram, 0, hardware=hardware)


def test_placement_prefers_the_hardware_measured_faster_among_nodes_that_fit() -> None:
    nodes = [_node("a", "slow", ram=16000), _node("b", "fast"), _node("c", "tiny", ram=500)]
    faster = Demand("m:cpu", ENGINE, Claim(1000), 1, throughput_by_hardware={"slow": 10.0, "fast": 40.0, "tiny": 900.0})
    assert [a.node_id for a in plan([faster], nodes, [], backoff={}, now=0).actions if isinstance(a, Start)] == [
        "b"
    ]  # "tiny" is fastest but does not fit
    # No run: as before, the node with the most room.
    unmeasured = Demand("m:cpu", ENGINE, Claim(1000), 1)
    assert [a.node_id for a in plan([unmeasured], nodes, [], backoff={}, now=0).actions if isinstance(a, Start)] == [
        "a"
    ]
    # Spreading still comes first: the second replica goes to the other node that fits.
    two = Demand("m:cpu", ENGINE, Claim(1000), 2, throughput_by_hardware={"slow": 10.0, "fast": 40.0})
    assert sorted(a.node_id for a in plan([two], nodes, [], backoff={}, now=0).actions if isinstance(a, Start)) == [
        "a",
        "b",
    ]


@pytest.mark.parametrize("value", ["-1.0", "601.0", "nan", "inf"])
@pytest.mark.parametrize("field", ["ttft_target", "itl_target"])
def test_a_latency_objective_out_of_range_is_refused_at_start(tmp_path: Path, field: str, value: str) -> None:
    path = tmp_path / "control.toml"
    path.write_text(f"""
[[models]]
name = "m"
[[models.profiles]]
name = "cpu"
weights = {{ url = "/models/m.gguf", sha256 = "{"a" * 64}", size = 1 }}
{field} = {value}
""")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert f"models ('m').profiles[0].{field}" in str(error.value) and "600 seconds" in str(error.value)
