"""Demand drives replicas: the reconciler reads the gateway's queue and slots (``_demands``).

The slots are taken through the real activator, as the gateway takes them; the reconciler runs on
trio's clock (autojumped), as it does in the daemon, with a fake dispatcher and no sockets.
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
from llmgw_shared.facts import HostFacts, unprobed
from llmgw_shared.wire import Command, DrainReplica, EngineState, ReplicaState, StartReplica

KEY = "m:cpu"


class Dispatcher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Command]] = []

    def send(self, node_id: str, command: Command) -> bool:
        self.sent.append((node_id, command))
        return True

    def starts(self) -> list[StartReplica]:
        taken, self.sent = self.sent, []
        return [c for _, c in taken if isinstance(c, StartReplica)]

    def drains(self) -> list[DrainReplica]:
        taken, self.sent = self.sent, []
        return [c for _, c in taken if isinstance(c, DrainReplica)]


@attrs.define
class World:
    reconciler: Reconciler
    dispatcher: Dispatcher
    activator: Activator
    replicas: ReplicaSet
    nodes: list[NodeRecord]
    held: list[Slot] = attrs.Factory(list)

    def pass_(self) -> None:
        for node in self.nodes:
            node.last_seen = trio.current_time()
        self.reconciler.reconcile_once()

    def ready(self, start: StartReplica) -> None:
        """The node reports the replica ready; the next pass publishes it."""
        node = next(n for n in self.nodes if n.node_id == self.reconciler.records[start.replica.replica_id].node_id)
        node.update_replicas(
            [*node.replicas.values(), ReplicaState(start.replica.replica_id, "ready", "", port=start.replica.port)]
        )
        self.pass_()

    def take_all_slots(self) -> None:
        while (slot := self.activator.try_acquire(KEY)) is not None:
            self.held.append(slot)

    def give_back(self, count: int) -> None:
        for _ in range(count):
            self.held.pop().give_back()


def world(*, max_replicas: int = 3, idle_timeout: float = 0.0, saturated_after: float = 10.0, nodes: int = 3) -> World:
    profile = ProfileConfig(
        name="cpu",
        weights=WeightsConfig("http://files/m.gguf", "a" * 64, 1000),
        context=512,
        parallel=2,
        max_replicas=max_replicas,
        idle_timeout=idle_timeout,
    )
    catalog = Catalog([ModelConfig("m", [profile])], [EngineConfig()])
    inventory, replicas, dispatcher = Inventory(), ReplicaSet(), Dispatcher()
    reconciler = Reconciler(
        catalog,
        inventory,
        Liveness(15, 60),
        dispatcher,
        replicas,
        secret=b"s" * 32,
        claims={KEY: Claim(1000)},
        config=ReconcilerConfig(saturated_after=saturated_after),
        clock=trio.current_time,
    )
    activator = Activator(replicas, demand=reconciler.demand, wake=reconciler.wake, status=reconciler.status)
    records = []
    for i in range(nodes):
        facts: HostFacts = attrs.evolve(unprobed(), probed=True, ram_total_mib=16000)
        node = NodeRecord(f"n{i + 1}", f"10.0.0.{i + 1}", facts, last_seen=trio.current_time())
        node.update_engines([EngineState("llama.cpp", "b11312", "installed")])
        inventory.put(node)
        records.append(node)
    return World(reconciler, dispatcher, activator, replicas, records)


async def _hold_when_served(w: World) -> None:
    outcome = await w.activator.wait(KEY)
    assert isinstance(outcome, Slot)
    with outcome:
        await trio.sleep_forever()


async def _queued(w: World, count: int, nursery: trio.Nursery) -> None:
    """``count`` requests waiting for a slot, each holding its slot once served (until cancelled)."""
    for _ in range(count):
        nursery.start_soon(_hold_when_served, w)
    await trio.testing.wait_all_tasks_blocked()


async def test_queued_requests_on_a_full_replica_start_another_one_at_a_time_up_to_max(
    autojump_clock: trio.testing.MockClock,
) -> None:
    w = world(max_replicas=3)
    async with trio.open_nursery() as nursery:
        await _queued(w, 1, nursery)
        w.pass_()
        (first,) = w.dispatcher.starts()  # cold start
        w.ready(first)
        assert w.dispatcher.starts() == []  # the waiter took a slot; one is still free
        w.take_all_slots()
        await _queued(w, 14, nursery)  # 16 requests on one replica of two slots
        w.pass_()
        (second,) = w.dispatcher.starts()
        w.pass_()
        assert w.dispatcher.starts() == []  # not a third while the second is starting
        w.ready(second)  # its two slots go to two of the waiters at once
        assert len(w.replicas.for_model(KEY)) == 2 and w.reconciler.demand.waiting(KEY) == 12
        w.pass_()
        (third,) = w.dispatcher.starts()
        w.ready(third)
        w.pass_()
        assert w.dispatcher.starts() == []  # max_replicas
        nursery.cancel_scope.cancel()


async def test_slots_busy_past_saturated_after_count_as_demand_without_a_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    w = world(saturated_after=10.0)
    async with trio.open_nursery() as nursery:
        await _queued(w, 1, nursery)
        w.pass_()
        (first,) = w.dispatcher.starts()
        w.ready(first)
        w.take_all_slots()  # at capacity (the waiter's slot and one more), nothing queued
        await trio.sleep(5)
        w.pass_()
        assert w.dispatcher.starts() == []
        w.give_back(1)  # a slot freed: the clock starts again
        w.take_all_slots()
        await trio.sleep(9)
        w.pass_()
        assert w.dispatcher.starts() == []
        await trio.sleep(2)
        w.pass_()
        assert len(w.dispatcher.starts()) == 1
        nursery.cancel_scope.cancel()


async def test_surplus_replicas_go_after_idle_timeout_although_traffic_reaches_every_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    w = world(idle_timeout=60.0)
    async with trio.open_nursery() as nursery:
        await _queued(w, 3, nursery)
        w.pass_()
        (first,) = w.dispatcher.starts()
        w.ready(first)  # two of the three served, one still waits
        w.pass_()
        (second,) = w.dispatcher.starts()
        w.ready(second)
        burst_over = trio.current_time()
        nursery.cancel_scope.cancel()
    assert all(r.in_flight == 0 for r in w.replicas.for_model(KEY))
    # From now on one request at a time, spread over both replicas: load for one replica.
    used: set[str] = set()
    drains: list[DrainReplica] = []
    for _ in range(40):
        slot = w.activator.try_acquire(KEY)
        assert slot is not None
        used.add(slot.replica.id)
        w.pass_()
        slot.give_back()
        await trio.sleep(5)
        w.pass_()
        drains = w.dispatcher.drains()
        if drains:
            break
    assert len(drains) == 1 and used == {first.replica.replica_id, second.replica.replica_id}
    # Not before the burst's need was idle_timeout old; the other replica keeps serving.
    assert trio.current_time() - burst_over >= 60
    assert len(w.replicas.for_model(KEY)) == 1
