"""The activator: requests for a model with no ready replica wait, bounded, for one to be published."""

from __future__ import annotations

import trio
import trio.testing

from llmgw_control.router.activator import Activator, ActivatorConfig
from llmgw_control.router.errors import ApiError
from llmgw_control.router.replicas import Replica, ReplicaSet


def activator(max_wait: float = 60.0, queue_size: int = 10) -> tuple[Activator, ReplicaSet, list[str]]:
    replicas = ReplicaSet()
    woken: list[str] = []
    waiting: dict[str, int] = {}
    act = Activator(replicas, ActivatorConfig(queue_size=queue_size, max_wait=max_wait), waiting=waiting,
                    wake=lambda: woken.append("wake"), status=lambda key: "no node fits")
    return act, replicas, woken


async def _outcome(act: Activator, key: str, into: list[object]) -> None:
    try:
        await act.wait_ready(key)
        into.append("ready")
    except ApiError as error:
        into.append(error)


async def test_a_waiting_request_is_served_when_a_replica_is_published(
    autojump_clock: trio.testing.MockClock,
) -> None:
    act, replicas, woken = activator()
    results: list[object] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_outcome, act, "m:cpu", results)
        await trio.sleep(5)
        assert act.queue_depth() == 1 and woken == ["wake"]
        replicas.publish(Replica("r1", "http://r1", frozenset({"m:cpu"})))
    assert results == ["ready"]
    assert act.queue_depth() == 0


async def test_the_wait_is_bounded_and_says_what_blocked(autojump_clock: trio.testing.MockClock) -> None:
    act, _, _ = activator(max_wait=30)
    results: list[object] = []
    await _outcome(act, "m:cpu", results)
    [error] = results
    assert isinstance(error, ApiError) and error.status == 503 and error.code == "model_not_ready"
    assert "no node fits" in error.message
    assert trio.current_time() >= 30


async def test_waiters_on_a_daemon_that_steps_down_are_answered_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    act, _, _ = activator(max_wait=120)
    results: list[object] = []
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(_outcome, act, "m:cpu", results)
        await trio.sleep(1)
        assert act.queue_depth() == 3
        act.stand_down("ws://control-b:8090/agent/v1")
    assert trio.current_time() < 2  # not max_wait later
    assert len(results) == 3
    for error in results:
        assert isinstance(error, ApiError) and error.status == 503 and error.code == "standby"
        assert "ws://control-b:8090/agent/v1" in error.message
        assert dict(error.headers)["retry-after"] == "1"
    assert act.queue_depth() == 0
    # A request arriving while this daemon is a standby is not queued either; leading again, it is.
    late: list[object] = []
    await _outcome(act, "m:cpu", late)
    assert isinstance(late[0], ApiError) and late[0].code == "standby"
    act.lead()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_outcome, act, "m:cpu", late)
        await trio.sleep(1)
        assert act.queue_depth() == 1
        nursery.cancel_scope.cancel()
