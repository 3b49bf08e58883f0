"""The reconciler loop with a fake dispatcher and a fake clock: no sockets, no sleeps."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from llmgw_control.catalog import Catalog, Claim, EngineConfig, ModelConfig, ProfileConfig, WeightsConfig
from llmgw_control.fleet.inventory import Inventory, Liveness, NodeRecord
from llmgw_control.fleet.reconciler import Reconciler, ReconcilerConfig
from llmgw_control.gateway.replicas import ReplicaSet
from llmgw_shared.facts import HostFacts, unprobed
from llmgw_shared.wire import Command, DrainReplica, EngineState, ReplicaState, StartReplica, StopReplica

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


def make(
    idle: float = 0.0,
    min_replicas: int = 0,
    on_replica_forgotten: Callable[[str], None] | None = None,
) -> tuple[Reconciler, FakeDispatcher, Inventory, ReplicaSet, Clock]:
    profile = ProfileConfig(
        name="cpu",
        weights=WeightsConfig("http://files/m.gguf", SHA, 1000),
        idle_timeout=idle,
        min_replicas=min_replicas,
        context=512,
        parallel=2,
    )
    catalog = Catalog([ModelConfig("m", [profile])], [EngineConfig()])
    inventory, replicas, dispatcher, clock = Inventory(), ReplicaSet(), FakeDispatcher(), Clock()
    reconciler = Reconciler(
        catalog,
        inventory,
        Liveness(15, 60),
        dispatcher,
        replicas,
        secret=b"s" * 32,
        claims={"m:cpu": Claim(1000)},
        config=ReconcilerConfig(),
        clock=clock,
        on_replica_forgotten=on_replica_forgotten,
    )
    return reconciler, dispatcher, inventory, replicas, clock


def add_node(inventory: Inventory, dispatcher: FakeDispatcher, clock: Clock, node_id: str) -> NodeRecord:
    node = NodeRecord(node_id, f"10.0.0.{len(inventory) + 1}", facts(), last_seen=clock.now)
    node.update_engines([EngineState("llama.cpp", "b11312", "installed")])
    inventory.put(node)
    dispatcher.connected.add(node_id)
    return node


def report(node: NodeRecord, replica_id: str, status: str, port: int, detail: str = "") -> None:
    node.update_replicas([ReplicaState(replica_id, status, detail, port=port)])  # type: ignore[arg-type]


def test_waiting_request_places_a_replica_and_ready_publishes_it() -> None:
    reconciler, dispatcher, inventory, replicas, clock = make()
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    assert dispatcher.take() == []  # nobody asked: scale-to-zero
    reconciler.demand.queued("m:cpu", 1)
    reconciler.reconcile_once()
    ((node_id, command),) = dispatcher.take()
    assert node_id == "n1" and isinstance(command, StartReplica)
    spec = command.replica
    assert spec.args[:6] == ["-c", "1024", "-np", "2", "--alias", "m"]
    assert spec.api_key == reconciler.replica_api_key(spec.replica_id)
    assert reconciler.adoption_key(spec.replica_id, "n1") == "m:cpu"
    assert replicas.for_model("m:cpu") == []
    report(node, spec.replica_id, "ready", spec.port)
    reconciler.reconcile_once()
    (replica,) = replicas.for_model("m:cpu")
    assert replica.url == f"http://10.0.0.1:{spec.port}" and replica.api_key == spec.api_key
    assert replica.served_name == "m" and replica.slots == 2  # the profile's parallel


def test_an_idle_replica_is_withdrawn_then_drained() -> None:
    reconciler, dispatcher, inventory, replicas, clock = make(idle=60)
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.demand.queued("m:cpu", 1)
    reconciler.reconcile_once()
    ((_, start),) = dispatcher.take()
    assert isinstance(start, StartReplica)
    report(node, start.replica.replica_id, "ready", start.replica.port)
    reconciler.demand.queued("m:cpu", 0)
    reconciler.reconcile_once()
    assert replicas.for_model("m:cpu")
    clock.now += 30
    node.last_seen = clock.now
    reconciler.reconcile_once()
    assert dispatcher.take() == []  # not idle long enough
    clock.now += 31
    node.last_seen = clock.now
    reconciler.reconcile_once()
    ((_, drain),) = dispatcher.take()
    assert isinstance(drain, DrainReplica) and drain.replica_id == start.replica.replica_id
    assert replicas.for_model("m:cpu") == []  # withdrawn before the drain was sent


def test_min_replicas_are_kept_without_traffic() -> None:
    reconciler, dispatcher, inventory, _, clock = make(idle=1, min_replicas=1)
    add_node(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    assert [type(c) for _, c in dispatcher.take()] == [StartReplica]


def test_a_failed_start_backs_off_and_moves_to_another_node() -> None:
    reconciler, dispatcher, inventory, _, clock = make()
    n1 = add_node(inventory, dispatcher, clock, "n1")
    reconciler.demand.queued("m:cpu", 1)
    reconciler.reconcile_once()
    ((first_node, start),) = dispatcher.take()
    assert isinstance(start, StartReplica)
    report(n1, start.replica.replica_id, "failed", start.replica.port, "exited with 1")
    add_node(inventory, dispatcher, clock, "n2")
    reconciler.reconcile_once()
    commands = dispatcher.take()
    assert (first_node, StopReplica(commands[0][1].id, 1, start.replica.replica_id)) == commands[0]  # type: ignore[union-attr]
    assert isinstance(commands[1][1], StartReplica) and commands[1][0] == "n2"
    assert reconciler.backoff[("m:cpu", "n1")][1] == "exited with 1"


def test_an_unreachable_node_is_withdrawn_and_a_lost_one_replaced() -> None:
    reconciler, dispatcher, inventory, replicas, clock = make()
    n1 = add_node(inventory, dispatcher, clock, "n1")
    reconciler.demand.queued("m:cpu", 1)
    reconciler.reconcile_once()
    ((_, start),) = dispatcher.take()
    assert isinstance(start, StartReplica)
    report(n1, start.replica.replica_id, "ready", start.replica.port)
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
    ((node_id, replacement),) = dispatcher.take()
    assert node_id == "n2" and isinstance(replacement, StartReplica)


def test_replicas_reported_after_a_control_restart_are_adopted_not_restarted() -> None:
    first, dispatcher, inventory, _, clock = make()
    n1 = add_node(inventory, dispatcher, clock, "n1")
    first.demand.queued("m:cpu", 1)
    first.reconcile_once()
    ((_, start),) = dispatcher.take()
    assert isinstance(start, StartReplica)
    # A new control with the same secret sees the node's hello with the running replica.
    second, dispatcher2, inventory2, replicas2, clock2 = make()
    node = add_node(inventory2, dispatcher2, clock2, "n1")
    report(node, start.replica.replica_id, "ready", start.replica.port)
    second.demand.queued("m:cpu", 1)
    second.reconcile_once()
    assert dispatcher2.take() == []
    (replica,) = replicas2.for_model("m:cpu")
    assert replica.id == start.replica.replica_id
    assert replica.api_key == start.replica.api_key  # same secret, same derived key
    del n1


def test_unknown_replicas_are_stopped() -> None:
    reconciler, dispatcher, inventory, _, clock = make()
    node = add_node(inventory, dispatcher, clock, "n1")
    report(node, "removed-model-0123abcd", "ready", 20005)
    reconciler.reconcile_once()
    ((_, stop),) = dispatcher.take()
    assert isinstance(stop, StopReplica) and stop.replica_id == "removed-model-0123abcd"


def test_status_explains_why_nothing_runs() -> None:
    reconciler, *_ = make()
    reconciler.demand.queued("m:cpu", 1)
    reconciler.reconcile_once()
    assert reconciler.status("m:cpu") == "no node is connected and schedulable"


def test_a_port_taken_by_another_process_is_avoided_without_backing_off() -> None:
    reconciler, dispatcher, inventory, _, clock = make()
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.demand.queued("m:cpu", 1)
    reconciler.reconcile_once()
    ((_, start),) = dispatcher.take()
    assert isinstance(start, StartReplica)
    report(
        node,
        start.replica.replica_id,
        "failed",
        start.replica.port,
        f"port {start.replica.port} on 127.0.0.1 is in use by another process",
    )
    reconciler.reconcile_once()
    commands = dispatcher.take()
    retry = [c for _, c in commands if isinstance(c, StartReplica)]
    assert len(retry) == 1 and retry[0].replica.port != start.replica.port
    assert ("m:cpu", "n1") not in reconciler.backoff


# --------------------------------------------------------------------------- the node's report is the truth


def rehello(
    inventory: Inventory,
    dispatcher: FakeDispatcher,
    clock: Clock,
    node_id: str,
    replicas: list[ReplicaState] | None = None,
    address: str | None = None,
) -> NodeRecord:
    """What ``AgentService._register`` does with a hello: a new record with the complete replica list."""
    old = inventory.get(node_id)
    node = NodeRecord(
        node_id,
        address or (old.address if old else "10.0.0.9"),
        facts(),
        last_seen=clock.now,
        connected_since=clock.now,
    )
    node.update_engines([EngineState("llama.cpp", "b11312", "installed")])
    node.update_replicas(replicas or [])
    inventory.put(node)
    dispatcher.connected.add(node_id)
    return node


def started(dispatcher: FakeDispatcher) -> list[tuple[str, StartReplica]]:
    return [(n, c) for n, c in dispatcher.take() if isinstance(c, StartReplica)]


def test_a_replica_missing_from_a_hello_is_forgotten_and_replaced() -> None:
    """The node restarted without its engines (kill -9 of both) before lost_after: its hello lists
    nothing. Before the fix the record stayed ready and was published again at a dead port."""
    reconciler, dispatcher, inventory, replicas, clock = make(min_replicas=1)
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    ((_, start),) = started(dispatcher)
    report(node, start.replica.replica_id, "ready", start.replica.port)
    reconciler.reconcile_once()
    assert replicas.for_model("m:cpu")
    clock.now += 1
    rehello(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    assert start.replica.replica_id not in reconciler.records
    assert replicas.get(start.replica.replica_id) is None
    ((node_id, again),) = started(dispatcher)  # min_replicas 1: a replacement at once
    assert node_id == "n1" and again.replica.replica_id != start.replica.replica_id


def test_a_start_lost_with_its_connection_or_a_download_cut_by_a_node_death_does_not_wait_forever() -> None:
    for last_seen in ("assigned", "downloading"):
        reconciler, dispatcher, inventory, _, clock = make(min_replicas=1)
        node = add_node(inventory, dispatcher, clock, "n1")
        reconciler.reconcile_once()
        ((_, start),) = started(dispatcher)
        if last_seen == "downloading":
            report(node, start.replica.replica_id, "downloading", start.replica.port, "41%")
            reconciler.reconcile_once()
        clock.now += 1
        rehello(inventory, dispatcher, clock, "n1")  # reconnected: the hello does not list it
        reconciler.reconcile_once()
        assert start.replica.replica_id not in reconciler.records, last_seen
        assert len(started(dispatcher)) == 1, last_seen


def test_a_start_that_never_left_control_is_forgotten_at_once() -> None:
    reconciler, dispatcher, inventory, _, clock = make(min_replicas=1)
    add_node(inventory, dispatcher, clock, "n1")
    add_node(inventory, dispatcher, clock, "n2")
    reconciler.reconcile_once()
    ((node_id, start),) = started(dispatcher)
    dispatcher.connected.discard(node_id)
    inventory.get(node_id).connected = False  # type: ignore[union-attr]
    reconciler.command_unsent(node_id, start)
    assert start.replica.replica_id not in reconciler.records
    reconciler.reconcile_once()
    ((other, _),) = started(dispatcher)
    assert other != node_id


def test_a_start_never_reported_fails_after_the_deadline_with_the_reason() -> None:
    reconciler, dispatcher, inventory, _, clock = make(min_replicas=1)
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    ((_, start),) = started(dispatcher)
    clock.now += reconciler.config.assigned_timeout + 1
    node.last_seen = clock.now
    reconciler.reconcile_once()
    assert reconciler.backoff[("m:cpu", "n1")][1] == ("node n1 did not report it within 60 s of being told to start it")
    assert any(isinstance(c, StopReplica) and c.replica_id == start.replica.replica_id for _, c in dispatcher.take())


def test_a_drain_the_node_has_not_carried_out_is_sent_again_after_a_hello() -> None:
    reconciler, dispatcher, inventory, replicas, clock = make()
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.demand.queued("m:cpu", 1)
    reconciler.reconcile_once()
    ((_, start),) = started(dispatcher)
    replica_id = start.replica.replica_id
    report(node, replica_id, "ready", start.replica.port)
    reconciler.reconcile_once()
    reconciler.demand.queued("m:cpu", 0)
    reconciler.drain_profile_key("m:cpu")
    (drain,) = [c for _, c in dispatcher.take() if isinstance(c, DrainReplica)]
    # The node reconnects (the drain was lost with the connection) and still runs it.
    rehello(inventory, dispatcher, clock, "n1", [ReplicaState(replica_id, "ready", port=start.replica.port)])
    reconciler.reconcile_once()
    (again,) = [c for _, c in dispatcher.take() if isinstance(c, DrainReplica)]
    assert again.replica_id == replica_id and again.id != drain.id
    assert replicas.get(replica_id) is None  # a stale "ready" does not undo the withdrawal
    assert reconciler.records[replica_id].status == "draining"


# --------------------------------------------------------------------------- adoption


def two_slug_alike() -> tuple[Reconciler, FakeDispatcher, Inventory, ReplicaSet, Clock]:
    weights = WeightsConfig("http://files/m.gguf", SHA, 1000)
    catalog = Catalog(
        [
            ModelConfig("a", [ProfileConfig(name="b-c", weights=weights)]),
            ModelConfig("a-b", [ProfileConfig(name="c", weights=weights)]),
        ],
        [EngineConfig()],
    )
    inventory, replicas, dispatcher, clock = Inventory(), ReplicaSet(), FakeDispatcher(), Clock()
    reconciler = Reconciler(
        catalog,
        inventory,
        Liveness(15, 60),
        dispatcher,
        replicas,
        secret=b"s" * 32,
        claims={"a:b-c": Claim(1000), "a-b:c": Claim(1000)},
        config=ReconcilerConfig(),
        clock=clock,
    )
    return reconciler, dispatcher, inventory, replicas, clock


def test_profiles_whose_names_slug_alike_are_adopted_as_themselves() -> None:
    """Model ``a`` profile ``b-c`` and model ``a-b`` profile ``c`` both slug to ``a-b-c``; before
    the fix a restarted control adopted the second profile's engine as the first."""
    first, dispatcher, inventory, _, clock = two_slug_alike()
    add_node(inventory, dispatcher, clock, "n1")
    first.demand.queued("a-b:c", 1)
    first.reconcile_once()
    ((_, start),) = started(dispatcher)
    second, dispatcher2, inventory2, replicas2, clock2 = two_slug_alike()
    node = add_node(inventory2, dispatcher2, clock2, "n1")
    report(node, start.replica.replica_id, "ready", start.replica.port)
    second.reconcile_once()
    assert second.records[start.replica.replica_id].profile_key == "a-b:c"
    assert [r.id for r in replicas2.for_model("a-b:c")] == [start.replica.replica_id]
    assert replicas2.for_model("a:b-c") == []


def test_a_node_can_only_have_adopted_what_control_started_on_that_node() -> None:
    first, dispatcher, inventory, _, clock = make()
    add_node(inventory, dispatcher, clock, "n1")
    first.demand.queued("m:cpu", 1)
    first.reconcile_once()
    ((_, start),) = started(dispatcher)
    real = start.replica.replica_id
    stem, nonce, _tag = real.rsplit("-", 2)
    forged = f"{stem}-{nonce}-{'0' * 16}"
    # A restarted control; n2 claims n1's replica and a forged one, each ready.
    reconciler, dispatcher, inventory, replicas, clock = make()
    intruder = add_node(inventory, dispatcher, clock, "n2")
    intruder.update_replicas([ReplicaState(real, "ready", port=20000), ReplicaState(forged, "ready", port=20001)])
    reconciler.reconcile_once()
    assert reconciler.records == {} and replicas.for_model("m:cpu") == []
    stops = sorted(c.replica_id for _, c in dispatcher.take() if isinstance(c, StopReplica))
    assert stops == sorted([real, forged])


def test_an_adopted_replica_is_published_only_at_the_nodes_own_address_and_a_port_control_gives() -> None:
    first, dispatcher, inventory, _, clock = make()
    add_node(inventory, dispatcher, clock, "n1")
    first.demand.queued("m:cpu", 1)
    first.demand.queued("m:cpu", 1)
    first.reconcile_once()
    ((_, start),) = started(dispatcher)
    first.config = attrs.evolve(first.config)
    other_id = first.new_replica_id("m:cpu", "n1")
    reconciler, dispatcher, inventory, replicas, clock = make()
    node = add_node(inventory, dispatcher, clock, "n1")
    node.update_replicas(
        [
            ReplicaState(start.replica.replica_id, "ready", port=start.replica.port),
            ReplicaState(other_id, "ready", port=22),
        ]
    )  # ssh: not a port control gives
    reconciler.reconcile_once()
    (replica,) = replicas.for_model("m:cpu")
    assert replica.url == f"http://{node.address}:{start.replica.port}"
    assert [c.replica_id for _, c in dispatcher.take() if isinstance(c, StopReplica)] == [other_id]
    # A later hello claiming another address does not take the replica (and its key) with it.
    rehello(
        inventory,
        dispatcher,
        clock,
        "n1",
        [ReplicaState(start.replica.replica_id, "ready", port=start.replica.port)],
        address="203.0.113.7",
    )
    reconciler.reconcile_once()
    assert replicas.get(start.replica.replica_id).url == f"http://{node.address}:{start.replica.port}"  # type: ignore[union-attr]


# --------------------------------------------------------------------------- limits and bounded state


def test_the_reschedule_limit_holds_when_two_of_three_nodes_are_lost() -> None:
    """1 move, then 1 per 20 s. Before the fix the bucket refilled and was never spent: every
    replica on the lost nodes moved in the first pass."""
    profile = ProfileConfig(
        name="cpu", weights=WeightsConfig("http://files/m.gguf", SHA, 1000), min_replicas=6, max_replicas=6
    )
    catalog = Catalog([ModelConfig("m", [profile])], [EngineConfig()])
    inventory, replicas, dispatcher, clock = Inventory(), ReplicaSet(), FakeDispatcher(), Clock()
    config = ReconcilerConfig(reschedule_burst=1, reschedules_per_minute=3)
    reconciler = Reconciler(
        catalog,
        inventory,
        Liveness(15, 60),
        dispatcher,
        replicas,
        secret=b"s" * 32,
        claims={"m:cpu": Claim(1000)},
        config=config,
        clock=clock,
    )
    nodes = {f"n{i}": add_node(inventory, dispatcher, clock, f"n{i}") for i in (1, 2, 3)}
    reconciler.reconcile_once()
    first = started(dispatcher)
    assert len(first) == 6
    for node_id, start in first:
        report(nodes[node_id], start.replica.replica_id, "ready", start.replica.port)
    reconciler.reconcile_once()
    nodes_list = list(nodes.values())
    clock.now += 61  # n2 and n3 lost; n1 keeps talking
    nodes_list[0].last_seen = clock.now
    moves = []
    for _ in range(60):  # a pass a second for a minute
        reconciler.reconcile_once()
        moves.append(len(started(dispatcher)))
        clock.now += 1
        nodes_list[0].last_seen = clock.now
    assert moves[0] == 1 and sum(moves[:19]) == 1  # the burst, then nothing for 20 s
    assert sum(moves[:21]) == 2 and sum(moves) == 3  # one more every 20 s


def test_a_lost_node_is_forgotten_after_the_retention() -> None:
    reconciler, dispatcher, inventory, _, clock = make(min_replicas=1)
    reconciler.config = attrs.evolve(reconciler.config, forget_nodes_after=600.0)
    n1 = add_node(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    ((_, start),) = started(dispatcher)
    reconciler.mark_failed(start.replica.replica_id, "exited with 1")
    n1.connected = False
    dispatcher.connected.clear()
    clock.now += 599
    reconciler.reconcile_once()
    assert inventory.get("n1") is not None
    clock.now += 2
    reconciler.reconcile_once()
    assert inventory.get("n1") is None and reconciler.records == {}
    assert not any(k[1] == "n1" for k in reconciler.backoff)


def test_the_metric_series_of_a_forgotten_replica_go_once_nothing_is_in_flight_on_it() -> None:
    forgotten: list[str] = []
    reconciler, dispatcher, inventory, replicas, clock = make(on_replica_forgotten=forgotten.append)
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.demand.queued("m:cpu", 1)
    reconciler.reconcile_once()
    ((_, start),) = started(dispatcher)
    report(node, start.replica.replica_id, "ready", start.replica.port)
    reconciler.reconcile_once()
    replica = replicas.get(start.replica.replica_id)
    assert replica is not None
    replica.in_flight = 1  # a request still running when the replica goes
    report(node, start.replica.replica_id, "stopped", start.replica.port)
    for _ in range(5):
        reconciler.reconcile_once()
        clock.now += 1
    assert start.replica.replica_id not in reconciler.records and forgotten == []
    replica.in_flight = 0
    for _ in range(4):
        reconciler.reconcile_once()
        clock.now += 1
    assert forgotten == [start.replica.replica_id]


def test_the_hold_after_a_takeover_ends_when_every_node_that_held_replicas_has_reported() -> None:
    reconciler, dispatcher, inventory, _, clock = make(min_replicas=1)
    reconciler.hold_until = clock.now + 15
    reconciler.awaited_nodes = frozenset({"n1", "n2"})
    add_node(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    assert dispatcher.take() == []  # n2 has not said hello yet: still holding
    add_node(inventory, dispatcher, clock, "n2")
    reconciler.reconcile_once()
    assert len(started(dispatcher)) == 1 and reconciler.hold_until == clock.now
