"""Two models that do not fit together on one node take turns; measured memory lets them share it.

The reconciler with the real activator (as test_demand.py): trio's clock, autojumped; a fake
dispatcher; the node's reports written into its record as the agent service would.
"""

from __future__ import annotations

import attrs
import trio
import trio.testing

from llmgw_control.catalog import Catalog, Claim, EngineConfig, ModelConfig, ProfileConfig, WeightsConfig
from llmgw_control.fleet.inventory import Inventory, Liveness, NodeRecord
from llmgw_control.fleet.reconciler import Reconciler, ReconcilerConfig
from llmgw_control.gateway.activator import Activator, Slot
from llmgw_control.gateway.replicas import ReplicaSet
from llmgw_shared.facts import GpuFacts, HostFacts, unprobed
from llmgw_shared.wire import Command, DrainReplica, EngineState, ReplicaState, StartReplica
from support.waiting import wait_until

A, B = "a:cpu", "b:cpu"
CONFIG = ReconcilerConfig(evict_min_age=60.0, yield_after=30.0, reserved_ram_mib=0)


class Dispatcher:
    def __init__(self) -> None:
        self.sent: list[Command] = []

    def send(self, node_id: str, command: Command) -> bool:
        self.sent.append(command)
        return True

    def take(self) -> tuple[list[StartReplica], list[DrainReplica]]:
        taken, self.sent = self.sent, []
        return ([c for c in taken if isinstance(c, StartReplica)], [c for c in taken if isinstance(c, DrainReplica)])


@attrs.define
class World:
    reconciler: Reconciler
    dispatcher: Dispatcher
    activator: Activator
    replicas: ReplicaSet
    node: NodeRecord

    def pass_(self) -> tuple[list[StartReplica], list[DrainReplica]]:
        self.node.last_seen = trio.current_time()
        self.reconciler.reconcile_once()
        return self.dispatcher.take()

    def report(self, replica_id: str, status: str, *, rss_mib: int = 0) -> None:
        port = self.reconciler.records[replica_id].port if replica_id in self.reconciler.records else 0
        others = [s for s in self.node.replicas.values() if s.replica_id != replica_id]
        self.node.update_replicas([*others, ReplicaState(replica_id, status, "", port=port, rss_mib=rss_mib)])  # type: ignore[arg-type]

    def key_of(self, replica_id: str) -> str:
        return self.reconciler.records[replica_id].profile_key


def world(ram: int = 8000, claim: int = 6000) -> World:
    def profile() -> ProfileConfig:
        return ProfileConfig(
            name="cpu",
            weights=WeightsConfig("http://files/m.gguf", "a" * 64, 1000),
            context=512,
            parallel=1,
            max_replicas=1,
            idle_timeout=300.0,
        )

    catalog = Catalog([ModelConfig("a", [profile()]), ModelConfig("b", [profile()])], [EngineConfig()])
    inventory, replicas, dispatcher = Inventory(), ReplicaSet(), Dispatcher()
    reconciler = Reconciler(
        catalog,
        inventory,
        Liveness(15, 60),
        dispatcher,
        replicas,
        secret=b"s" * 32,
        claims={A: Claim(claim), B: Claim(claim)},
        config=CONFIG,
        clock=trio.current_time,
    )
    activator = Activator(replicas, demand=reconciler.demand, wake=reconciler.wake, status=reconciler.status)
    facts: HostFacts = attrs.evolve(unprobed(), probed=True, ram_total_mib=ram, arch="x86_64")
    node = NodeRecord("n1", "10.0.0.1", facts, last_seen=trio.current_time())
    node.update_engines([EngineState("llama.cpp", "b11312", "installed")])
    inventory.put(node)
    return World(reconciler, dispatcher, activator, replicas, node)


async def _answered(w: World, profile_key: str, hold: float, answers: list[str]) -> None:
    """One request: waits for a slot, holds it for ``hold`` seconds (the generation), is answered."""
    outcome = await w.activator.wait(profile_key)
    assert isinstance(outcome, Slot), outcome
    with outcome:
        await trio.sleep(hold)
    answers.append(profile_key)


async def test_two_models_too_big_together_take_turns_and_every_request_is_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    w = world()
    answers: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answered, w, A, 1.0, answers)
        await trio.testing.wait_all_tasks_blocked()
        (start_a,), _ = w.pass_()
        a = start_a.replica.replica_id
        w.report(a, "ready", rss_mib=5900)
        w.pass_()
        await trio.sleep(2)
        assert answers == [A]
        # B is asked for while A (idle now) still runs: B fits only in A's place, and A is young.
        nursery.start_soon(_answered, w, B, 1.0, answers)
        await trio.testing.wait_all_tasks_blocked()
        starts, drains = w.pass_()
        assert (starts, drains) == ([], [])
        assert "needs 6000 MiB RAM, has 2100 MiB free" in w.reconciler.status(B)
        await trio.sleep(CONFIG.evict_min_age)  # A is old enough to be evicted now
        starts, drains = w.pass_()
        assert starts == [] and [d.replica_id for d in drains] == [a]
        assert w.replicas.get(a) is None  # withdrawn before its drain
        assert w.reconciler.status(B).startswith(
            "making room on node n1: waiting for"
        ) or "evicting idle" in w.reconciler.status(B)
        w.report(a, "stopped")
        (start_b,), _ = w.pass_()
        b = start_b.replica.replica_id
        assert w.key_of(b) == B
        w.report(b, "ready", rss_mib=5900)
        w.pass_()
        await trio.sleep(2)
        assert answers == [A, B]
        # A went back to scale from zero: nothing starts it again until a request waits for it.
        await trio.sleep(CONFIG.evict_min_age)
        assert w.pass_() == ([], [])
        nursery.start_soon(_answered, w, A, 1.0, answers)
        await trio.testing.wait_all_tasks_blocked()
        _, drains = w.pass_()
        assert [d.replica_id for d in drains] == [b]
        w.report(b, "stopped")
        (again,), _ = w.pass_()
        w.report(again.replica.replica_id, "ready")
        w.pass_()
        await trio.sleep(2)
        assert answers == [A, B, A]
        assert w.reconciler.evictions == {A: 1, B: 1}


async def test_a_stream_for_the_resident_model_makes_it_yield_after_the_bounded_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Requests for A keep coming, so A is never idle; B's requests must not wait for ever."""
    w = world()
    answers: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answered, w, A, 5.0, answers)
        await trio.testing.wait_all_tasks_blocked()
        (start_a,), _ = w.pass_()
        a = start_a.replica.replica_id
        w.report(a, "ready")
        w.pass_()
        await trio.sleep(CONFIG.evict_min_age)

        async def stream() -> None:
            while True:  # one request after another for A, each 5 s, bounded by the cancel below
                nursery.start_soon(_answered, w, A, 5.0, answers)
                await trio.sleep(2)

        nursery.start_soon(stream)
        await trio.sleep(1)
        b_waits_since = trio.current_time()
        nursery.start_soon(_answered, w, B, 1.0, answers)
        await trio.testing.wait_all_tasks_blocked()
        # One reconciler pass a tick, until one drains something.
        drains: list[DrainReplica] = await wait_until(
            lambda: w.pass_()[1], timeout=CONFIG.yield_after + 10, interval=CONFIG.interval
        )
        waited = trio.current_time() - b_waits_since
        assert CONFIG.yield_after <= waited < CONFIG.yield_after + 2 * CONFIG.interval
        assert [d.replica_id for d in drains] == [a]
        w.report(a, "stopped")
        (start_b,), _ = w.pass_()
        assert w.key_of(start_b.replica.replica_id) == B
        w.report(start_b.replica.replica_id, "ready")
        w.pass_()
        await wait_until(lambda: B in answers, timeout=10, interval=0.5)
        nursery.cancel_scope.cancel()


async def test_measured_use_lets_two_models_share_a_node_and_corrects_the_next_claim(
    autojump_clock: trio.testing.MockClock,
) -> None:
    w = world()
    answers: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answered, w, A, 1.0, answers)
        await trio.testing.wait_all_tasks_blocked()
        (start_a,), _ = w.pass_()
        a = start_a.replica.replica_id
        # Estimated 6000 MiB; the node measured 1800.
        w.report(a, "ready", rss_mib=1800)
        w.pass_()
        assert w.reconciler.measured.by_kind(A) == {"x86_64": Claim(1800)}
        nursery.start_soon(_answered, w, B, 1.0, answers)
        await trio.testing.wait_all_tasks_blocked()
        (start_b,), drains = w.pass_()  # 8000 - 1800 leaves room for B's 6000: no eviction
        assert drains == [] and w.key_of(start_b.replica.replica_id) == B
        w.report(start_b.replica.replica_id, "ready", rss_mib=1700)
        w.pass_()
        await trio.sleep(2)
        assert sorted(answers) == [A, B]
        # A's next replica is placed with what A was measured to use on this kind of node.
        w.report(a, "stopped")
        w.pass_()
        nursery.start_soon(_answered, w, A, 1.0, answers)
        await trio.testing.wait_all_tasks_blocked()
        (again,), _ = w.pass_()
        assert again.replica.replica_id != a and w.reconciler.records[again.replica.replica_id].claim == Claim(1800)
        nursery.cancel_scope.cancel()


async def test_the_start_names_the_gpus_placement_chose(autojump_clock: trio.testing.MockClock) -> None:
    profile = ProfileConfig(
        name="gpu",
        weights=WeightsConfig("http://files/m.gguf", "a" * 64, 1000),
        context=512,
        parallel=1,
        vram_mib=30000,
        gpus=2,
        min_replicas=1,
    )
    catalog = Catalog([ModelConfig("g", [profile])], [EngineConfig()])
    dispatcher = Dispatcher()
    inventory = Inventory()
    reconciler = Reconciler(
        catalog,
        inventory,
        Liveness(15, 60),
        dispatcher,
        ReplicaSet(),
        secret=b"s" * 32,
        claims={"g:gpu": Claim(1000, 30000)},
        config=CONFIG,
        clock=trio.current_time,
    )
    gpus = [
        GpuFacts(index=i, name="NVIDIA L4", uuid=f"GPU-{i}", memory_total_mib=size, memory_free_mib=size)
        for i, size in enumerate([24000, 8000, 24000])
    ]
    facts: HostFacts = attrs.evolve(unprobed(), probed=True, ram_total_mib=64000, arch="x86_64", gpus=gpus)
    node = NodeRecord("n1", "10.0.0.1", facts, last_seen=trio.current_time())
    node.update_engines([EngineState("llama.cpp", "b11312", "installed")])
    inventory.put(node)
    reconciler.reconcile_once()
    (start,), _ = dispatcher.take()
    assert start.replica.devices == [0, 2]  # 15 GB shares: GPU 1 (8 GB) cannot hold one
    assert reconciler.records[start.replica.replica_id].devices == (0, 2)
