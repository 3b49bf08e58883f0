"""Replica statuses and their transition table; the reschedule token bucket; and the reconciler
driven by random (hostile) node reports, which must never crash it or break the table."""

from __future__ import annotations

from typing import get_args

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw_control.catalog import Catalog, Claim, EngineConfig, ModelConfig, ProfileConfig, WeightsConfig
from llmgw_control.fleet import lifecycle
from llmgw_control.fleet.inventory import Inventory, Liveness, NodeRecord
from llmgw_control.fleet.lifecycle import TERMINAL, ImpossibleTransition, ReplicaStatus
from llmgw_control.fleet.reconciler import Reconciler, ReconcilerConfig
from llmgw_control.fleet.token_bucket import TokenBucket
from llmgw_control.gateway.replicas import ReplicaSet
from llmgw_shared.facts import unprobed
from llmgw_shared.wire import Command, EngineState, ReplicaState, StartReplica, WireReplicaStatus


def test_the_statuses_are_the_wire_statuses_plus_assigned() -> None:
    assert set(get_args(WireReplicaStatus)) == {s.value for s in ReplicaStatus} - {"assigned"}


def test_terminal_statuses_have_no_way_out_and_nothing_returns_to_assigned() -> None:
    for status in ReplicaStatus:
        assert not lifecycle.allowed(status, ReplicaStatus.ASSIGNED) or status == ReplicaStatus.ASSIGNED
        for end in TERMINAL:
            assert not lifecycle.allowed(end, status)
    with pytest.raises(ImpossibleTransition, match="ready -> downloading"):
        lifecycle.check("s1", ReplicaStatus.READY, ReplicaStatus.DOWNLOADING)
    with pytest.raises(ImpossibleTransition):
        lifecycle.check("s1", ReplicaStatus.DRAINING, ReplicaStatus.READY)
    # a crash restart
    assert lifecycle.check("s1", ReplicaStatus.READY, ReplicaStatus.STARTING) == ReplicaStatus.STARTING


def test_the_token_bucket_grants_a_burst_then_its_rate_and_spends_what_it_grants() -> None:
    bucket = TokenBucket(capacity=1, per_second=1 / 20)
    assert bucket.available(100.0) == 1
    bucket.spend(1, 100.0)
    assert bucket.available(100.0) == 0
    assert bucket.available(119.9) == 0
    assert bucket.available(120.0) == 1
    bucket.spend(1, 120.0)
    assert bucket.available(1000.0) == 1  # never more than the capacity, however long it rests
    with pytest.raises(ValueError):
        bucket.spend(2, 1000.0)
    assert bucket.available(999.0) == 1  # a clock going backwards refills nothing


# --------------------------------------------------------------------------- random reports

SHA = "a" * 64
NODES = ("n1", "n2", "n3")


class Dispatcher:
    def __init__(self) -> None:
        self.connected: set[str] = set(NODES)
        self.sent: list[tuple[str, Command]] = []

    def send(self, node_id: str, command: Command) -> bool:
        if node_id not in self.connected:
            return False
        self.sent.append((node_id, command))
        return True


def node_record(node_id: str, now: float) -> NodeRecord:
    node = NodeRecord(
        node_id,
        f"10.0.0.{node_id[1]}",
        attrs.evolve(unprobed(), probed=True, ram_total_mib=16000),
        last_seen=now,
        connected_since=now,
    )
    node.update_engines([EngineState("llama.cpp", "b11312", "installed")])
    return node


statuses = st.sampled_from(get_args(WireReplicaStatus))
events = st.lists(
    st.one_of(
        # A node reports a status for one of the replicas control started (by index), or for any id.
        st.tuples(st.just("report"), st.sampled_from(NODES), st.integers(0, 7), statuses, st.integers(0, 70000)),
        st.tuples(
            st.just("hello"), st.sampled_from(NODES), st.lists(st.tuples(st.integers(0, 7), statuses), max_size=4)
        ),
        st.tuples(st.just("silence"), st.sampled_from(NODES)),
        st.tuples(st.just("refused"), st.integers(0, 7)),
        st.tuples(st.just("unsent"), st.integers(0, 7)),
        st.tuples(
            st.just("drain"),
        ),
        st.tuples(st.just("time"), st.floats(0, 120)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events)
def test_no_sequence_of_reports_crashes_the_reconciler_or_breaks_the_table(script: list[tuple]) -> None:  # type: ignore[type-arg]
    profile = ProfileConfig(
        name="cpu",
        weights=WeightsConfig("http://files/m.gguf", SHA, 1000),
        min_replicas=2,
        max_replicas=3,
        context=512,
        parallel=2,
    )
    catalog = Catalog([ModelConfig("m", [profile])], [EngineConfig()])
    now = [1000.0]
    inventory, replicas, dispatcher = Inventory(), ReplicaSet(), Dispatcher()
    reconciler = Reconciler(
        catalog,
        inventory,
        Liveness(15, 60),
        dispatcher,
        replicas,
        secret=b"s" * 32,
        claims={"m:cpu": Claim(1000)},
        config=ReconcilerConfig(reschedule_burst=1),
        clock=lambda: now[0],
    )
    for node_id in NODES:
        inventory.put(node_record(node_id, now[0]))
    seen: dict[str, ReplicaStatus] = {}

    def started() -> list[StartReplica]:
        return [c for _, c in dispatcher.sent if isinstance(c, StartReplica)]

    def replica_id(index: int) -> str:
        starts = started()
        return starts[index % len(starts)].replica.replica_id if starts else f"m-cpu-{index:08x}-{'0' * 16}"

    def check_pass() -> None:
        reconciler.reconcile_once()  # raises on an impossible transition control made itself
        for sid in set(seen) - set(reconciler.records):
            del seen[sid]  # forgotten: a later record under that id (adopted again) is a new life
        for sid, record in reconciler.records.items():
            before = seen.get(sid)
            assert before is None or before == record.status or lifecycle.allowed(before, record.status), (
                sid,
                before,
                record.status,
            )
            seen[sid] = record.status
            published = replicas.get(sid)
            if published is not None:
                assert record.status == ReplicaStatus.READY and not record.draining
                assert published.url.startswith(f"http://{record.address}:")

    check_pass()
    for event in script:
        kind = event[0]
        if kind == "report":
            _, node_id, index, status, port = event
            node = inventory.get(node_id)
            if node is not None:
                node.update_replicas([ReplicaState(replica_id(index), status, port=port)])
                node.last_seen = now[0]
        elif kind == "hello":
            _, node_id, listed = event
            node = node_record(node_id, now[0])
            node.update_replicas([ReplicaState(replica_id(i), s, port=20000 + i) for i, s in listed])
            inventory.put(node)
            dispatcher.connected.add(node_id)
        elif kind == "silence":
            node = inventory.get(event[1])
            if node is not None:
                node.connected = False
            dispatcher.connected.discard(event[1])
        elif kind == "refused":
            for node_id, command in dispatcher.sent[-8:]:
                if isinstance(command, StartReplica) and command.replica.replica_id == replica_id(event[1]):
                    reconciler.command_failed(node_id, command, "node refused start_shard: no")
        elif kind == "unsent":
            for node_id, command in dispatcher.sent[-8:]:
                if isinstance(command, StartReplica) and command.replica.replica_id == replica_id(event[1]):
                    reconciler.command_unsent(node_id, command)
        elif kind == "drain":
            reconciler.drain_profile_key("m:cpu")
        else:
            now[0] += event[1]
            for node_id in dispatcher.connected:
                node = inventory.get(node_id)
                if node is not None:
                    node.last_seen = now[0]
        check_pass()
