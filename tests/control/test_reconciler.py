"""The reconciler loop with a fake dispatcher and a fake clock: no sockets, no sleeps."""

from __future__ import annotations

import attrs

from llmgw_control.catalog import Catalog, EngineConfig, ModelConfig, ProfileConfig, WeightsConfig
from llmgw_control.fleet.inventory import Inventory, Liveness, NodeRecord
from llmgw_control.fleet.plan import Claim
from llmgw_control.fleet.reconciler import Reconciler, ReconcilerConfig, shard_key
from llmgw_control.router.replicas import ReplicaSet
from llmgw_shared.facts import HostFacts, unprobed
from llmgw_shared.wire import Command, DrainShard, EngineState, ShardState, StartShard, StopShard

SHA = "a" * 64


class FakeDispatcher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Command]] = []
        self.connected: set[str] = set()

    def send(self, node_id: str, command: Command) -> bool:
        if node_id not in self.connected:
            return False
        self.sent.append((node_id, command))
        return True

    def take(self) -> list[tuple[str, Command]]:
        sent, self.sent = self.sent, []
        return sent


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def facts(ram: int = 16000) -> HostFacts:
    return attrs.evolve(unprobed(), probed=True, ram_total_mib=ram)


def make(idle: float = 0.0, min_replicas: int = 0) -> tuple[Reconciler, FakeDispatcher, Inventory, ReplicaSet, Clock]:
    profile = ProfileConfig(name="cpu", weights=WeightsConfig("http://files/m.gguf", SHA, 1000),
                            idle_timeout=idle, min_replicas=min_replicas, context=512, parallel=2)
    catalog = Catalog([ModelConfig("m", [profile])], [EngineConfig()])
    inventory, replicas, dispatcher, clock = Inventory(), ReplicaSet(), FakeDispatcher(), Clock()
    reconciler = Reconciler(catalog, inventory, Liveness(15, 60), dispatcher, replicas, secret=b"s" * 32,
                            claims={"m:cpu": Claim(1000)}, config=ReconcilerConfig(), clock=clock)
    return reconciler, dispatcher, inventory, replicas, clock


def add_node(inventory: Inventory, dispatcher: FakeDispatcher, clock: Clock, node_id: str) -> NodeRecord:
    node = NodeRecord(node_id, f"10.0.0.{len(inventory) + 1}", facts(), last_seen=clock.now)
    node.update_engines([EngineState("llama.cpp", "b11312", "installed")])
    inventory.put(node)
    dispatcher.connected.add(node_id)
    return node


def report(node: NodeRecord, shard_id: str, status: str, port: int, detail: str = "") -> None:
    node.update_shards([ShardState(shard_id, status, detail, port=port)])  # type: ignore[arg-type]


def test_waiting_request_places_a_replica_and_ready_publishes_it() -> None:
    reconciler, dispatcher, inventory, replicas, clock = make()
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    assert dispatcher.take() == []  # nobody asked: scale-to-zero
    reconciler.waiting["m:cpu"] = 1
    reconciler.reconcile_once()
    (node_id, command), = dispatcher.take()
    assert node_id == "n1" and isinstance(command, StartShard)
    spec = command.shard
    assert spec.args[:6] == ["-c", "1024", "-np", "2", "--alias", "m"]
    assert spec.api_key == reconciler.shard_api_key(spec.shard_id)
    assert shard_key(spec.shard_id, reconciler.catalog) == "m:cpu"
    assert replicas.for_model("m:cpu") == []
    report(node, spec.shard_id, "ready", spec.port)
    reconciler.reconcile_once()
    (replica,) = replicas.for_model("m:cpu")
    assert replica.url == f"http://10.0.0.1:{spec.port}" and replica.api_key == spec.api_key
    assert replica.served_name == "m" and replica.slots == 2  # the profile's parallel


def test_an_idle_replica_is_withdrawn_then_drained() -> None:
    reconciler, dispatcher, inventory, replicas, clock = make(idle=60)
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.waiting["m:cpu"] = 1
    reconciler.reconcile_once()
    (_, start), = dispatcher.take()
    assert isinstance(start, StartShard)
    report(node, start.shard.shard_id, "ready", start.shard.port)
    reconciler.waiting.clear()
    reconciler.reconcile_once()
    assert replicas.for_model("m:cpu")
    clock.now += 30
    node.last_seen = clock.now
    reconciler.reconcile_once()
    assert dispatcher.take() == []  # not idle long enough
    clock.now += 31
    node.last_seen = clock.now
    reconciler.reconcile_once()
    (_, drain), = dispatcher.take()
    assert isinstance(drain, DrainShard) and drain.shard_id == start.shard.shard_id
    assert replicas.for_model("m:cpu") == []  # withdrawn before the drain was sent


def test_min_replicas_are_kept_without_traffic() -> None:
    reconciler, dispatcher, inventory, _, clock = make(idle=1, min_replicas=1)
    add_node(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    assert [type(c) for _, c in dispatcher.take()] == [StartShard]


def test_a_failed_start_backs_off_and_moves_to_another_node() -> None:
    reconciler, dispatcher, inventory, _, clock = make()
    n1 = add_node(inventory, dispatcher, clock, "n1")
    reconciler.waiting["m:cpu"] = 1
    reconciler.reconcile_once()
    (first_node, start), = dispatcher.take()
    assert isinstance(start, StartShard)
    report(n1, start.shard.shard_id, "failed", start.shard.port, "exited with 1")
    add_node(inventory, dispatcher, clock, "n2")
    reconciler.reconcile_once()
    commands = dispatcher.take()
    assert (first_node, StopShard(commands[0][1].id, 1, start.shard.shard_id)) == commands[0]  # type: ignore[union-attr]
    assert isinstance(commands[1][1], StartShard) and commands[1][0] == "n2"
    assert reconciler.backoff[("m:cpu", "n1")][1] == "exited with 1"


def test_an_unreachable_node_is_withdrawn_and_a_lost_one_replaced() -> None:
    reconciler, dispatcher, inventory, replicas, clock = make()
    n1 = add_node(inventory, dispatcher, clock, "n1")
    reconciler.waiting["m:cpu"] = 1
    reconciler.reconcile_once()
    (_, start), = dispatcher.take()
    assert isinstance(start, StartShard)
    report(n1, start.shard.shard_id, "ready", start.shard.port)
    reconciler.reconcile_once()
    assert replicas.for_model("m:cpu")
    n2 = add_node(inventory, dispatcher, clock, "n2")
    clock.now += 20  # n1 silent past unreachable_after
    n2.last_seen = clock.now
    reconciler.reconcile_once()
    assert replicas.for_model("m:cpu") == []
    assert dispatcher.take() == []  # unreachable is not lost: nothing moves yet
    clock.now += 50
    n2.last_seen = clock.now
    reconciler.reconcile_once()
    (node_id, replacement), = dispatcher.take()
    assert node_id == "n2" and isinstance(replacement, StartShard)


def test_shards_reported_after_a_control_restart_are_adopted_not_restarted() -> None:
    first, dispatcher, inventory, _, clock = make()
    n1 = add_node(inventory, dispatcher, clock, "n1")
    first.waiting["m:cpu"] = 1
    first.reconcile_once()
    (_, start), = dispatcher.take()
    assert isinstance(start, StartShard)
    # A new control with the same secret sees the node's hello with the running shard.
    second, dispatcher2, inventory2, replicas2, clock2 = make()
    node = add_node(inventory2, dispatcher2, clock2, "n1")
    report(node, start.shard.shard_id, "ready", start.shard.port)
    second.waiting["m:cpu"] = 1
    second.reconcile_once()
    assert dispatcher2.take() == []
    (replica,) = replicas2.for_model("m:cpu")
    assert replica.id == start.shard.shard_id
    assert replica.api_key == start.shard.api_key  # same secret, same derived key
    del n1


def test_unknown_shards_are_stopped() -> None:
    reconciler, dispatcher, inventory, _, clock = make()
    node = add_node(inventory, dispatcher, clock, "n1")
    report(node, "removed-model-0123abcd", "ready", 20005)
    reconciler.reconcile_once()
    (_, stop), = dispatcher.take()
    assert isinstance(stop, StopShard) and stop.shard_id == "removed-model-0123abcd"


def test_status_explains_why_nothing_runs() -> None:
    reconciler, *_ = make()
    reconciler.waiting["m:cpu"] = 1
    reconciler.reconcile_once()
    assert reconciler.status("m:cpu") == "no node is connected and schedulable"


def test_a_port_taken_by_another_process_is_avoided_without_backing_off() -> None:
    reconciler, dispatcher, inventory, _, clock = make()
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.waiting["m:cpu"] = 1
    reconciler.reconcile_once()
    (_, start), = dispatcher.take()
    assert isinstance(start, StartShard)
    report(node, start.shard.shard_id, "failed", start.shard.port,
           f"port {start.shard.port} on 127.0.0.1 is in use by another process")
    reconciler.reconcile_once()
    commands = dispatcher.take()
    retry = [c for _, c in commands if isinstance(c, StartShard)]
    assert len(retry) == 1 and retry[0].shard.port != start.shard.port
    assert ("m:cpu", "n1") not in reconciler.backoff
