"""A standby's router follows the leader's published replicas through the store (both databases)."""

from __future__ import annotations

import trio

from llmgw_control.fleet.view import ViewFollower, ViewPublisher
from llmgw_control.gateway.replicas import Replica, ReplicaSet
from llmgw_control.store import SqlStore
from support.waiting import wait_until


async def _until(condition: object, limit: float = 10.0) -> None:
    await wait_until(condition, timeout=limit, interval=0.01)  # type: ignore[arg-type]


async def test_a_standby_adds_updates_and_withdraws_what_the_leader_publishes(store: SqlStore) -> None:
    leader, standby = ReplicaSet(), ReplicaSet()
    mine: set[str] = set()
    publisher = ViewPublisher(store, leader, lambda: mine)
    follower = ViewFollower(store, standby, lambda replica_id: f"key-of-{replica_id}")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(publisher.run, 1)
        nursery.start_soon(follower.run)
        leader.publish(Replica(id="s1", url="http://10.0.0.1:9001", models=frozenset({"llama:small"}), slots=2))
        leader.publish(Replica(id="static", url="http://x:1", models=frozenset({"other"})))  # not the reconciler's
        mine.add("s1")
        await _until(lambda: standby.get("s1") is not None)
        copy = standby.get("s1")
        assert copy is not None and copy.slots == 2 and copy.api_key == "key-of-s1"
        assert standby.for_model("llama:small") == [copy] and standby.get("static") is None
        leader.publish(Replica(id="s1", url="http://10.0.0.9:9001", models=frozenset({"llama:small"}), slots=2))
        await _until(lambda: standby.get("s1").url == "http://10.0.0.9:9001")  # type: ignore[union-attr]
        leader.withdraw("s1")
        mine.clear()
        await _until(lambda: standby.get("s1") is None)
        assert standby.for_model("llama:small") == []
        nursery.cancel_scope.cancel()


async def test_a_deposed_leader_stops_publishing(store: SqlStore) -> None:
    await store.lease.try_acquire("a", "ws://a", 30)
    await store.lease.give_up("a")
    grant = await store.lease.try_acquire("b", "ws://b", 30)
    assert grant is not None
    replicas = ReplicaSet([Replica(id="s1", url="http://h:1", models=frozenset({"m"}), slots=1)])
    with trio.fail_after(10):
        await ViewPublisher(store, replicas, lambda: {"s1"}).run(grant.epoch - 1)  # returns: refused
    assert await store.replica_view() is None
