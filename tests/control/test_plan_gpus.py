"""The plan fits VRAM claims on specific GPUs: one, or several for tensor split; no GPU over-committed."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.fleet.gpus import share
from llmgw_control.fleet.lifecycle import ReplicaStatus
from llmgw_control.fleet.plan import Assignment, Claim, Demand, PlanNode, Start, plan
from llmgw_shared.wire import EngineState

ENGINE = ("llama.cpp", "b11312")
INSTALLED = {ENGINE: EngineState("llama.cpp", "b11312", "installed")}
L4 = 24000


def gpu_node(node_id: str = "g", gpus: tuple[int, ...] = (L4, L4), ram: int = 64000) -> PlanNode:
    return PlanNode(
        node_id, "ready", False, {}, INSTALLED, ram, sum(gpus), frozenset(), "x86_64+L4", tuple(enumerate(gpus))
    )


def demand(profile_key: str, vram: int, *, wanted: int = 1, gpus: int = 1) -> Demand:
    return Demand(profile_key, ENGINE, Claim(1000, vram), wanted, gpus=gpus)


def on_gpu(replica: str, profile_key: str, vram: int, devices: tuple[int, ...], port: int = 20000) -> Assignment:
    return Assignment(replica, profile_key, "g", port, Claim(1000, vram), ReplicaStatus.READY, devices=devices)


def starts(actions: list[object]) -> list[Start]:
    return [a for a in actions if isinstance(a, Start)]


def test_eight_gpus_are_not_one_big_gpu() -> None:
    # Two 16 GB replicas on two 24 GB GPUs leave 16 GB free in total but 8 GB on each: a third
    # 16 GB replica fits on neither.
    p = plan([demand("m:gpu", 16000, wanted=3)], [gpu_node()], [], backoff={}, now=0)
    assert sorted(s.devices for s in starts(p.actions)) == [(0,), (1,)]
    assert p.blocked["m:gpu"] == (
        "no node fits: node g: needs 16000 MiB VRAM on each of 1 GPU(s), the freest has 8000 MiB"
    )


def test_tensor_split_puts_equal_shares_on_several_gpus() -> None:
    p = plan([demand("big:gpu", 40000, gpus=2)], [gpu_node()], [], backoff={}, now=0)
    assert starts(p.actions) == [Start("g", "big:gpu", 20000, Claim(1000, 40000), (0, 1))]
    # 38 GB free in total, but GPU 0 has 14 GB of the 15 GB share: refused.
    p = plan([demand("huge:gpu", 30000, gpus=2)], [gpu_node()], [on_gpu("s1", "a:gpu", 10000, (0,))], backoff={}, now=0)
    assert starts(p.actions) == [] and "needs 15000 MiB VRAM on each of 2 GPU(s)" in p.blocked["huge:gpu"]


def test_best_fit_keeps_the_large_free_gpu_for_a_large_model() -> None:
    existing = [on_gpu("s1", "a:gpu", 14000, (1,))]
    p = plan([demand("small:gpu", 8000)], [gpu_node()], existing, backoff={}, now=0)
    assert [s.devices for s in starts(p.actions)] == [(1,)]


def test_a_replica_whose_gpus_are_unknown_counts_on_every_gpu() -> None:
    adopted = [on_gpu("s1", "a:gpu", 20000, ())]  # 10 GB counted on each of the two
    p = plan([demand("m:gpu", 16000)], [gpu_node()], adopted, backoff={}, now=0)
    assert starts(p.actions) == []
    p = plan([demand("m:gpu", 14000)], [gpu_node()], adopted, backoff={}, now=0)
    assert len(starts(p.actions)) == 1


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 30000), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 30000), st.integers(1, 3), st.integers(0, 3)), max_size=5),
)
def test_no_gpu_is_ever_over_committed(totals: list[int], wants: list[tuple[int, int, int]]) -> None:
    node = gpu_node(gpus=tuple(totals))
    demands = [demand(f"m{i}:gpu", vram, gpus=count, wanted=n) for i, (vram, count, n) in enumerate(wants)]
    p = plan(demands, [node], [], backoff={}, now=0)
    used = dict.fromkeys(range(len(totals)), 0)
    for start in starts(p.actions):
        if start.claim.vram_mib:
            demanded = next(d for d in demands if d.profile_key == start.profile_key)
            assert len(start.devices) == demanded.gpus and len(set(start.devices)) == len(start.devices)
            for device in start.devices:
                used[device] += share(start.claim.vram_mib, len(start.devices))
    assert all(used[i] <= totals[i] for i in used)


def test_eviction_frees_a_gpu_and_never_evicts_for_a_claim_no_gpu_can_hold() -> None:
    residents = [
        Assignment("s0", "a:gpu", "g", 20000, Claim(1000, 16000), ReplicaStatus.READY, last_used=5, devices=(0,)),
        Assignment("s1", "b:gpu", "g", 20001, Claim(1000, 16000), ReplicaStatus.READY, last_used=9, devices=(1,)),
    ]
    p = plan([demand("c:gpu", 20000)], [gpu_node()], residents, backoff={}, now=1000)
    assert [a.replica_id for a in p.actions] == ["s0"]  # the least recently used; its GPU then holds 20 GB
    # 30 GB on one 24 GB GPU: the node's total would do after evicting both, no GPU ever would.
    p = plan([demand("c:gpu", 30000)], [gpu_node()], residents, backoff={}, now=1000)
    assert p.actions == [] and p.blocked["c:gpu"].startswith("no node fits: node g: needs 1000 MiB RAM and 30000")


DEGRADED = "this node has NVIDIA GPUs but its llama.cpp engine is a CPU build"


def test_a_gpu_profile_is_not_placed_on_a_degraded_node() -> None:
    # GPUs and only a CPU build: its VRAM is there, and a GPU profile placed on it would run at
    # CPU speed. The healthy GPU node gets it; with only the degraded one, nothing does, and why.
    degraded = attrs.evolve(gpu_node("a-degraded"), degraded=DEGRADED)
    p = plan([demand("m:gpu", 16000)], [degraded, gpu_node("b-ok")], [], backoff={}, now=0)
    assert [(s.node_id, s.devices) for s in starts(p.actions)] == [("b-ok", (0,))]
    p = plan([demand("m:gpu", 16000)], [degraded], [], backoff={}, now=0)
    assert starts(p.actions) == []
    assert p.blocked["m:gpu"] == (
        f"no node fits: node a-degraded: degraded, CPU only ({DEGRADED}); this GPU profile does not say cpu_ok"
    )


def test_a_cpu_ok_profile_runs_on_a_degraded_node_on_ram_without_gpus() -> None:
    degraded = attrs.evolve(gpu_node("a-degraded"), degraded=DEGRADED)
    ok = Demand("m:gpu", ENGINE, Claim(1000, 16000), 1, cpu_ok=True)
    p = plan([ok], [degraded], [], backoff={}, now=0)
    assert starts(p.actions) == [Start("a-degraded", "m:gpu", 20000, Claim(17000, 0), ())]


def test_a_cpu_profile_is_placed_on_a_degraded_node_as_on_any_other() -> None:
    degraded = attrs.evolve(gpu_node("a-degraded"), degraded=DEGRADED)
    p = plan([demand("small:cpu", 0)], [degraded], [], backoff={}, now=0)
    assert [s.node_id for s in starts(p.actions)] == ["a-degraded"]


def test_a_profile_pinned_to_a_backend_goes_only_to_nodes_whose_build_carries_it() -> None:
    from llmgw_shared.wire import EngineProvenance

    def built(node_id: str, backend: str) -> PlanNode:
        provenance = EngineProvenance("http://control/releases", "", [], 0.0, backend=backend)
        return attrs.evolve(
            gpu_node(node_id), engines={ENGINE: EngineState("llama.cpp", "b11312", "installed", provenance=provenance)}
        )

    pinned = Demand("m:vk", ENGINE, Claim(1000, 8000), 1, backend="vulkan")
    p = plan([pinned], [built("a-cuda", "cuda"), built("b-vulkan", "vulkan")], [], backoff={}, now=0)
    assert [s.node_id for s in starts(p.actions)] == ["b-vulkan"]
    p = plan([pinned], [built("a-cuda", "cuda")], [], backoff={}, now=0)
    assert p.blocked["m:vk"] == (
        "no node fits: node a-cuda: llama.cpp b11312 is a cuda build; the profile pins backend vulkan"
    )


def test_a_backend_pin_must_name_a_backend() -> None:
    from llmgw_control.catalog.models import EngineConfig, ModelConfig, ProfileConfig, model_problems

    def problems(backend: str) -> list[tuple[str, str]]:
        model = ModelConfig(
            name="m", profiles=[ProfileConfig(name="gpu", backend=backend, model_dir="/models/m", ram_mib=100)]
        )
        return model_problems(model, [EngineConfig(name="llama.cpp", version="b11312")])

    assert not [p for p in problems("vulkan") if p[0].endswith(".backend")]
    assert ("profiles[0].backend", "must be one of '', 'cuda', 'rocm', 'vulkan', 'cpu'") in problems("gpu")
