"""The replica set tells its listeners (added as they are built) of every model whose replicas
opened slots: a replica published, resized (``resize``: its counters stay) or readmitted."""

from __future__ import annotations

from llmgw_control.gateway.replicas import Replica, ReplicaSet


def _replica(rid: str = "r1", slots: int = 2) -> Replica:
    return Replica(id=rid, url="http://127.0.0.1:1", models=frozenset({"m:cpu"}), slots=slots)


def test_a_listener_is_told_of_each_publish_resize_and_readmission() -> None:
    told: list[str] = []
    replicas = ReplicaSet()
    replicas.listen(told.append)
    replica = _replica()
    replicas.publish(replica)
    replica.in_flight = 2
    replicas.resize("r1", 4)
    assert (replica.slots, replica.in_flight) == (4, 2) and replicas.get("r1") is replica
    replicas.resize("r1", 4)  # no change: nothing opened
    replicas.resize("gone", 8)  # not published: nothing to resize
    replicas.slots_opened(replica)
    assert told == ["m:cpu", "m:cpu", "m:cpu"]


def test_every_listener_is_told() -> None:
    first: list[str] = []
    second: list[str] = []
    replicas = ReplicaSet()
    replicas.listen(first.append)
    replicas.listen(second.append)
    replicas.publish(_replica())
    assert first == second == ["m:cpu"]
