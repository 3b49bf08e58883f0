"""The reconciler's pure plan: placement, spreading, backoff, lost nodes, scale down."""

from __future__ import annotations

from llmgw_control.fleet.plan import (
    Assignment,
    Claim,
    Demand,
    Drain,
    Forget,
    PlanLimits,
    PlanNode,
    Start,
    Stop,
    plan,
)
from llmgw_shared.wire import EngineState

ENGINE = ("llama.cpp", "b11312")
INSTALLED = {ENGINE: EngineState("llama.cpp", "b11312", "installed")}


def node(
    node_id: str,
    *,
    ram: int = 8000,
    state: str = "ready",
    engines: dict | None = None,  # type: ignore[type-arg]
    labels: dict[str, str] | None = None,
    cordoned: bool = False,
    busy: frozenset[int] = frozenset(),
) -> PlanNode:
    return PlanNode(node_id, state, cordoned, labels or {}, INSTALLED if engines is None else engines, ram, 0, busy)


def demand(
    profile_key: str = "m:cpu", wanted: int = 1, ram: int = 1000, labels: dict[str, str] | None = None
) -> Demand:
    return Demand(profile_key, ENGINE, Claim(ram), wanted, labels or {})


def assignment(
    replica: str,
    node_id: str,
    *,
    profile_key: str = "m:cpu",
    port: int = 20000,
    status: str = "ready",
    ram: int = 1000,
    last_used: float = 0.0,
    draining: bool = False,
) -> Assignment:
    return Assignment(replica, profile_key, node_id, port, Claim(ram), status, "", draining, last_used)


def starts(p: object) -> list[Start]:
    return [a for a in p.actions if isinstance(a, Start)]  # type: ignore[attr-defined]


def test_places_on_a_node_with_the_engine_and_room() -> None:
    p = plan([demand()], [node("a", ram=500), node("b")], [], backoff={}, now=0)
    assert starts(p) == [Start("b", "m:cpu", 20000, Claim(1000))]
    assert p.blocked == {}


def test_replicas_of_one_profile_are_spread_across_nodes() -> None:
    p = plan([demand(wanted=3)], [node("a"), node("b"), node("c")], [], backoff={}, now=0)
    assert sorted(s.node_id for s in starts(p)) == ["a", "b", "c"]


def test_ports_never_collide_on_one_node() -> None:
    existing = [assignment("s1", "a", port=20000)]
    p = plan([demand(wanted=3)], [node("a", ram=10000, busy=frozenset({20001}))], existing, backoff={}, now=0)
    assert [s.port for s in starts(p)] == [20002, 20003]


def test_no_free_port_is_a_reason() -> None:
    p = plan([demand()], [node("a")], [], backoff={}, now=0, limits=PlanLimits(20000, 20000))
    assert starts(p)  # one port is enough for one
    full = [assignment("s1", "a", profile_key="other:x", port=20000)]
    p = plan([demand()], [node("a")], full, backoff={}, now=0, limits=PlanLimits(20000, 20000))
    assert not starts(p) and "no free port" in p.blocked["m:cpu"]


def test_installing_engine_is_reported_in_the_nodes_own_words() -> None:
    installing = {
        ENGINE: EngineState(
            "llama.cpp", "b11312", "installing", "downloading llama-b11312-bin-linux-x64.tar.gz (6 MB, 41%)"
        )
    }
    p = plan([demand()], [node("gpu-3", engines=installing)], [], backoff={}, now=0)
    assert not starts(p)
    assert p.blocked["m:cpu"] == (
        "no node fits: node gpu-3: llama.cpp b11312: installing: downloading "
        "llama-b11312-bin-linux-x64.tar.gz (6 MB, 41%)"
    )


def test_not_enough_memory_names_the_need_and_what_is_free() -> None:
    p = plan([demand(ram=9000)], [node("a", ram=8000)], [], backoff={}, now=0)
    assert "needs 9000 MiB RAM, has 8000 MiB free" in p.blocked["m:cpu"]


def test_claims_of_running_replicas_count_against_free_memory() -> None:
    running = [assignment("s1", "a", profile_key="big:x", ram=7500)]
    p = plan([demand(ram=1000)], [node("a", ram=8000), node("b", ram=2000)], running, backoff={}, now=0)
    assert [s.node_id for s in starts(p)] == ["b"]


def test_unreachable_cordoned_and_unlabelled_nodes_are_skipped() -> None:
    nodes = [
        node("a", state="unreachable"),
        node("b", cordoned=True),
        node("c", labels={"gpu": "no"}),
        node("d", labels={"gpu": "yes"}),
    ]
    p = plan([demand(labels={"gpu": "yes"})], nodes, [], backoff={}, now=0)
    assert [s.node_id for s in starts(p)] == ["d"]
    p = plan([demand()], [node("a", state="lost")], [], backoff={}, now=0)
    assert p.blocked["m:cpu"] == "no node is connected and schedulable"


def test_backoff_after_a_failed_start_keeps_the_model_off_that_node_until_it_expires() -> None:
    backoff = {("m:cpu", "a"): (100.0, "exit 1: missing library libgomp.so.1")}
    p = plan([demand()], [node("a")], [], backoff=backoff, now=50)
    assert not starts(p)
    assert "start failed on node a: exit 1: missing library libgomp.so.1 (retrying in 50 s)" in p.blocked["m:cpu"]
    p = plan([demand()], [node("a")], [], backoff=backoff, now=101)
    assert [s.node_id for s in starts(p)] == ["a"]


def test_failed_replicas_are_stopped_forgotten_and_replaced_elsewhere() -> None:
    failed = [assignment("s1", "a", status="failed")]
    backoff = {("m:cpu", "a"): (100.0, "crashed")}
    p = plan([demand()], [node("a"), node("b")], failed, backoff=backoff, now=0)
    assert Stop("s1", "a", "failed") in p.actions
    assert any(isinstance(a, Forget) and a.replica_id == "s1" for a in p.actions)
    assert [s.node_id for s in starts(p)] == ["b"]


def test_replicas_on_lost_nodes_move_within_the_reschedule_budget() -> None:
    on_lost = [assignment(f"s{i}", f"n{i}", profile_key=f"m{i}:cpu") for i in range(5)]
    nodes = [node(f"n{i}", state="lost") for i in range(5)] + [node("spare", ram=100000)]
    demands = [demand(f"m{i}:cpu") for i in range(5)]
    p = plan(demands, nodes, on_lost, backoff={}, now=0, limits=PlanLimits(reschedule_budget=2))
    assert len([a for a in p.actions if isinstance(a, Forget)]) == 2
    assert len(starts(p)) == 2  # the other three stay put until the budget refills


def test_surplus_is_drained_starting_with_replicas_not_yet_serving_then_least_recently_used() -> None:
    live = [
        assignment("old", "a", last_used=10),
        assignment("new", "b", last_used=50),
        assignment("boot", "c", status="starting"),
    ]
    p = plan([demand(wanted=1)], [node("a"), node("b"), node("c")], live, backoff={}, now=60)
    assert p.actions == [Drain("boot", "c"), Drain("old", "a")]


def test_draining_and_stopped_replicas_do_not_count_as_live() -> None:
    existing = [assignment("d", "a", draining=True, status="draining"), assignment("s", "b", status="stopped")]
    p = plan([demand()], [node("a"), node("b")], existing, backoff={}, now=0)
    assert Forget("s", "stopped") in p.actions
    assert len(starts(p)) == 1
    done = [assignment("d", "a", draining=True, status="stopped")]
    p = plan([demand(wanted=0)], [node("a")], done, backoff={}, now=0)
    assert p.actions == [Forget("d", "drained and stopped")]


def test_wanted_zero_places_nothing_and_explains_nothing() -> None:
    p = plan([demand(wanted=0)], [node("a")], [], backoff={}, now=0)
    assert p.actions == [] and p.blocked == {}


def test_a_node_without_an_engine_named_by_path_is_skipped_silently() -> None:
    vllm = ("vllm", "0.9.1")
    has = {vllm: EngineState("vllm", "0.9.1", "configured")}
    lacks = {vllm: EngineState("vllm", "0.9.1", "unconfigured", "vllm is not configured here")}
    want = Demand("q:gpu", vllm, Claim(1000), 1)
    # Too small, and one without vLLM: the reason names only the node that has it.
    p = plan([want], [node("small", ram=500, engines=has), node("cpu-only", engines=lacks)], [], backoff={}, now=0)
    assert not starts(p)
    assert "small" in p.blocked["q:gpu"] and "cpu-only" not in p.blocked["q:gpu"]
    p = plan([want], [node("gpu", engines=has), node("cpu-only", engines=lacks)], [], backoff={}, now=0)
    assert [s.node_id for s in starts(p)] == ["gpu"]
    # No node has it at all: said once, without a "failed" per node.
    p = plan([want], [node("a", engines=lacks), node("b", engines=lacks)], [], backoff={}, now=0)
    assert p.blocked["q:gpu"] == "no node has vllm configured (a node names it by path in its [[engines]])"
