"""The reconciler's side of the admin API, with a fake dispatcher and clock: cordons that outlive
a reconnect, drains that withdraw before they tell the node, and models removed behind its back."""

from __future__ import annotations

from typing import Any

from llmgw_control.fleet.inventory import NodeRecord
from llmgw_shared.wire import DrainReplica, StartReplica

from ..test_reconciler import add_node, make, report


def start_one() -> tuple[Any, ...]:
    reconciler, dispatcher, inventory, replicas, clock = make(min_replicas=1)
    node = add_node(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    ((_, start),) = dispatcher.take()
    assert isinstance(start, StartReplica)
    report(node, start.replica.replica_id, "ready", start.replica.port)
    reconciler.reconcile_once()
    assert replicas.for_model("m:cpu")
    return reconciler, dispatcher, inventory, replicas, clock, start.replica.replica_id


def test_a_cordon_set_before_the_node_connects_holds_and_outlives_a_new_record() -> None:
    reconciler, dispatcher, inventory, _, clock = make(min_replicas=1)
    reconciler.cordon("n1")
    add_node(inventory, dispatcher, clock, "n1")
    reconciler.reconcile_once()
    assert dispatcher.take() == []
    assert "schedulable" in reconciler.status("m:cpu")
    # A reconnect replaces the record (cordoned=False on it): the cordon still holds.
    old = inventory.get("n1")
    assert old is not None
    inventory.put(NodeRecord("n1", old.address, old.facts, dict(old.engines), last_seen=clock.now))
    reconciler.reconcile_once()
    assert dispatcher.take() == [] and reconciler.is_cordoned("n1")
    reconciler.uncordon("n1")
    reconciler.reconcile_once()
    assert [type(c) for _, c in dispatcher.take()] == [StartReplica]


def test_drain_node_withdraws_first_then_drains_and_places_elsewhere() -> None:
    reconciler, dispatcher, inventory, replicas, clock, replica_id = start_one()
    add_node(inventory, dispatcher, clock, "n2")
    assert reconciler.drain_node("n1") == [replica_id]
    assert replicas.for_model("m:cpu") == []  # withdrawn in the call itself
    ((node_id, drain),) = dispatcher.take()
    assert node_id == "n1" and isinstance(drain, DrainReplica) and drain.replica_id == replica_id
    assert reconciler.drain_node("n1") == []  # already draining: nothing sent twice
    reconciler.reconcile_once()
    ((node_id, start),) = dispatcher.take()
    assert node_id == "n2" and isinstance(start, StartReplica)


def test_replicas_of_a_model_removed_from_the_catalog_are_drained_by_the_next_pass() -> None:
    reconciler, dispatcher, _, replicas, _, replica_id = start_one()
    reconciler.catalog.remove("m")
    reconciler.reconcile_once()
    ((_, drain),) = dispatcher.take()
    assert isinstance(drain, DrainReplica) and drain.replica_id == replica_id
    assert replicas.get(replica_id) is None
    reconciler.reconcile_once()
    assert dispatcher.take() == []
