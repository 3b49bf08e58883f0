"""The activator: admission to replica slots, one bounded queue per model, typed wait results.

Driven with trio's autojump clock and plain replicas: no sockets. The class of failure these
tests guard is a slot that leaks (a replica that looks busy forever) or a request served out of
turn, whatever order arrivals, releases, publishes and cancellations come in.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.gateway.activator import Activator, ActivatorConfig, Refusal, Slot
from llmgw_control.gateway.replicas import Replica, ReplicaSet
from llmgw_control.priority import Priority

KEY = "m:cpu"


def activator(
    max_wait: float = 60.0, queue_size: int = 10, batch_after: int = 4, replicas: ReplicaSet | None = None
) -> tuple[Activator, ReplicaSet, list[str]]:
    replicas = replicas if replicas is not None else ReplicaSet()
    woken: list[str] = []
    act = Activator(
        replicas,
        ActivatorConfig(queue_size=queue_size, max_wait=max_wait, batch_after=batch_after),
        wake=lambda: woken.append("wake"),
        status=lambda key: "no node fits",
    )
    return act, replicas, woken


def replica(id: str = "r1", slots: int = 2, models: frozenset[str] = frozenset({KEY})) -> Replica:
    return Replica(id, f"http://{id}", models, slots=slots)


async def _wait(
    act: Activator,
    into: list[object],
    tag: object = None,
    priority: Priority = Priority.INTERACTIVE,
    hold: trio.Event | None = None,
    exclude: frozenset[str] = frozenset(),
) -> None:
    """Wait for a slot, record the outcome (with ``tag``), hold the slot until ``hold`` is set."""
    outcome = await act.wait(KEY, priority, exclude=exclude)
    if isinstance(outcome, Slot):
        with outcome:
            into.append(tag if tag is not None else outcome.replica.id)
            if hold is not None:
                await hold.wait()
    else:
        into.append(outcome)


async def test_a_free_slot_is_taken_at_once_and_given_back_by_the_guard() -> None:
    act, replicas, _ = activator()
    r1 = replica(slots=2)
    replicas.publish(r1)
    first, second = act.try_acquire(KEY), act.try_acquire(KEY)
    assert first is not None and second is not None
    assert r1.in_flight == 2 and act.try_acquire(KEY) is None  # full
    assert r1.full_since is not None
    with first:
        pass
    assert r1.in_flight == 1 and r1.full_since is None
    second.give_back()
    second.give_back()  # a second release gives nothing back twice
    assert r1.in_flight == 0


async def test_a_waiting_request_is_served_when_a_replica_is_published(
    autojump_clock: trio.testing.MockClock,
) -> None:
    act, replicas, woken = activator()
    results: list[object] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_wait, act, results)
        await trio.sleep(5)
        assert act.queue_depth() == 1 and act.demand.snapshot() == {KEY: 1} and woken == ["wake"]
        replicas.publish(replica())
    assert results == ["r1"]
    assert act.queue_depth() == 0 and act.demand.snapshot() == {}


async def test_the_wait_is_bounded_and_says_what_blocked(autojump_clock: trio.testing.MockClock) -> None:
    act, replicas, _ = activator(max_wait=30)
    results: list[object] = []
    await _wait(act, results)
    assert results == [Refusal.TIMEOUT] and trio.current_time() >= 30
    error = act.refusal_error(Refusal.TIMEOUT, KEY)
    assert error.status == 503 and error.code == "model_not_ready" and "no node fits" in error.message
    # With replicas whose slots stay busy, the 503 says that instead.
    replicas.publish(replica(slots=1))
    held = act.try_acquire(KEY)
    await _wait(act, results)
    assert results[-1] is Refusal.TIMEOUT
    busy = act.refusal_error(Refusal.TIMEOUT, KEY)
    assert busy.status == 503 and busy.code == "model_overloaded" and "1 slot(s)" in busy.message
    assert held is not None
    held.give_back()


async def test_a_full_queue_overflows_with_429_and_retry_after(autojump_clock: trio.testing.MockClock) -> None:
    act, replicas, _ = activator(queue_size=2)
    replicas.publish(replica(slots=1))
    held = act.try_acquire(KEY)
    results: list[object] = []
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(_wait, act, results)
        await trio.testing.wait_all_tasks_blocked()
        assert results == [Refusal.OVERFLOW] and act.queue_depth() == 2
        error = act.refusal_error(Refusal.OVERFLOW, KEY)
        assert error.status == 429 and error.code == "model_queue_full" and dict(error.headers)["retry-after"]
        assert error.body()["error"]["type"] == "rate_limit_error"
        assert held is not None
        held.give_back()
    assert results[1:] == ["r1", "r1"]


async def test_freed_slots_go_to_waiters_first_come_first_served(autojump_clock: trio.testing.MockClock) -> None:
    act, replicas, _ = activator()
    r1 = replica(slots=1)  # one holder at a time: the order served is the order recorded
    replicas.publish(r1)
    held = act.try_acquire(KEY)
    assert held is not None
    order: list[object] = []
    async with trio.open_nursery() as nursery:
        for tag in range(5):
            nursery.start_soon(_wait, act, order, tag)
            await trio.testing.wait_all_tasks_blocked()
        held.give_back()
        # Handed on, not freed: a request arriving now finds the slot taken.
        assert r1.in_flight == 1 and act.try_acquire(KEY) is None
    assert order == [0, 1, 2, 3, 4]
    assert r1.in_flight == 0


async def test_interactive_goes_first_and_batch_is_never_starved(autojump_clock: trio.testing.MockClock) -> None:
    act, replicas, _ = activator(batch_after=2, queue_size=100)
    replicas.publish(replica(slots=1))
    held = act.try_acquire(KEY)
    assert held is not None
    order: list[object] = []
    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(_wait, act, order, f"b{i}", Priority.BATCH)
            await trio.testing.wait_all_tasks_blocked()
        for i in range(6):
            nursery.start_soon(_wait, act, order, f"i{i}", Priority.INTERACTIVE)
            await trio.testing.wait_all_tasks_blocked()
        held.give_back()
    # Interactive first, FIFO within a class, and a batch request after at most two interactive.
    assert order == ["i0", "i1", "b0", "i2", "i3", "b1", "i4", "i5", "b2"]


async def test_a_cancelled_waiter_leaves_the_queue(autojump_clock: trio.testing.MockClock) -> None:
    act, replicas, _ = activator()
    r1 = replica(slots=1)
    replicas.publish(r1)
    held = act.try_acquire(KEY)
    assert held is not None
    results: list[object] = []
    with trio.move_on_after(3):
        await _wait(act, results)
    assert results == [] and act.queue_depth() == 0 and act.demand.snapshot() == {}
    held.give_back()
    assert r1.in_flight == 0


async def test_a_slot_granted_as_its_waiter_is_cancelled_is_passed_on(autojump_clock: trio.testing.MockClock) -> None:
    act, replicas, _ = activator()
    r1 = replica(slots=1)
    replicas.publish(r1)
    held = act.try_acquire(KEY)
    assert held is not None
    results: list[object] = []
    async with trio.open_nursery() as nursery:
        doomed = trio.CancelScope()

        async def waiter_that_is_cancelled() -> None:
            with doomed:
                await _wait(act, results, "doomed")

        nursery.start_soon(waiter_that_is_cancelled)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_wait, act, results, "next")
        await trio.testing.wait_all_tasks_blocked()
        # In one step, before either task runs: the first waiter is cancelled, and the slot freed
        # next is handed to it (it is still first in the queue) -- it must pass the slot on.
        doomed.cancel()
        held.give_back()
    assert results == ["next"]
    assert r1.in_flight == 0 and act.queue_depth() == 0 and act.dropped == 0


async def test_a_retry_waits_only_for_replicas_it_has_not_tried(autojump_clock: trio.testing.MockClock) -> None:
    act, replicas, _ = activator()
    r1, r2 = replica("r1", slots=1), replica("r2", slots=1)
    replicas.publish(r1)
    replicas.publish(r2)
    on_r1, on_r2 = act.try_acquire(KEY, exclude={"r2"}), act.try_acquire(KEY, exclude={"r1"})
    assert on_r1 is not None and on_r2 is not None
    results: list[object] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_wait, act, results, None, Priority.INTERACTIVE, None, frozenset({"r1"}))
        await trio.testing.wait_all_tasks_blocked()
        on_r1.give_back()  # free, but this waiter failed there already
        await trio.testing.wait_all_tasks_blocked()
        assert results == [] and r1.in_flight == 0
        on_r2.give_back()
    assert results == ["r2"]
    # Every replica tried: nothing to wait for.
    assert await act.wait(KEY, exclude={"r1", "r2"}) is Refusal.EXHAUSTED


async def test_a_slot_freed_on_a_replica_of_two_models_serves_either(autojump_clock: trio.testing.MockClock) -> None:
    act, replicas, _ = activator()
    shared = replica("shared", slots=1, models=frozenset({"other", KEY}))
    replicas.publish(shared)
    held = act.try_acquire("other")
    assert held is not None
    results: list[object] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_wait, act, results)
        await trio.testing.wait_all_tasks_blocked()
        held.give_back()
    assert results == ["shared"] and shared.in_flight == 0


async def test_waiters_on_a_daemon_that_steps_down_are_answered_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    act, _, _ = activator(max_wait=120)
    results: list[object] = []
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(_wait, act, results)
        await trio.sleep(1)
        assert act.queue_depth() == 3
        act.stand_down("ws://control-b:8090/agent/v1")
    assert trio.current_time() < 2  # not max_wait later
    assert results == [Refusal.STANDBY] * 3
    error = act.refusal_error(Refusal.STANDBY, KEY)
    assert error.status == 503 and error.code == "standby" and "ws://control-b:8090/agent/v1" in error.message
    assert dict(error.headers)["retry-after"] == "1"
    assert act.queue_depth() == 0 and act.demand.snapshot() == {}
    # A request arriving while this daemon is a standby is not queued either; leading again, it is.
    late: list[object] = []
    await _wait(act, late)
    assert late == [Refusal.STANDBY]
    act.lead()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_wait, act, late)
        await trio.sleep(1)
        assert act.queue_depth() == 1
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------------- the class, generated

_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.sampled_from(list(Priority))),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("finish"), st.integers(0, 30)),
        st.tuples(st.just("publish"), st.integers(1, 3)),
        st.tuples(st.just("withdraw"), st.integers(0, 3)),
        st.tuples(st.just("sleep"), st.sampled_from([0.0, 1.0, 50.0])),
        # Until a settle, steps happen in one go: a cancellation and a release meet in one tick.
        st.tuples(st.just("settle"), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(_STEPS)
def test_no_sequence_of_arrivals_cancellations_and_changes_leaks_a_slot(steps: list[tuple[str, object]]) -> None:
    """Whatever happens, in whatever order: no replica ever has more requests than slots, a free
    slot never sits idle while a waiter could use it, and when everything is over every slot is
    back and the queue is empty."""

    async def scenario() -> None:
        act, replicas, _ = activator(max_wait=60, queue_size=8)
        published: list[Replica] = []
        scopes: list[trio.CancelScope] = []
        done: list[trio.Event] = []

        def check() -> None:
            free = [r for r in replicas.for_model(KEY) if r.in_flight < r.slots]
            for r in published:
                assert 0 <= r.in_flight <= r.slots
            if free:
                assert act.queue_depth() == 0, "a waiter waits while a slot is free"

        async def request(scope: trio.CancelScope, finished: trio.Event, priority: Priority) -> None:
            with scope:
                slot: Slot | Refusal | None = act.try_acquire(KEY)
                if slot is None:
                    slot = await act.wait(KEY, priority)
                if isinstance(slot, Slot):
                    with slot:
                        await finished.wait()

        async with trio.open_nursery() as nursery:
            for kind, arg in steps:
                if kind == "arrive":
                    assert isinstance(arg, Priority)
                    scopes.append(trio.CancelScope())
                    done.append(trio.Event())
                    nursery.start_soon(request, scopes[-1], done[-1], arg)
                elif kind == "cancel" and scopes:
                    assert isinstance(arg, int)
                    scopes[arg % len(scopes)].cancel()
                elif kind == "finish" and done:
                    assert isinstance(arg, int)
                    done[arg % len(done)].set()
                elif kind == "publish":
                    assert isinstance(arg, int)
                    new = replica(f"r{len(published)}", slots=arg)
                    published.append(new)
                    replicas.publish(new)
                elif kind == "withdraw" and published:
                    assert isinstance(arg, int)
                    replicas.withdraw(published[arg % len(published)].id)
                elif kind == "sleep":
                    assert isinstance(arg, float)
                    await trio.sleep(arg)
                elif kind == "settle":
                    await trio.testing.wait_all_tasks_blocked()
                    check()
            for event in done:
                event.set()
            for scope in scopes:
                scope.cancel()
        assert all(r.in_flight == 0 for r in published)
        assert act.queue_depth() == 0 and act.demand.snapshot() == {}
        assert act.dropped == 0, "a slot was only given back by the safety net"

    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize("how", ["released", "dropped"])
def test_a_slot_is_given_back_however_its_holder_ends(how: str) -> None:
    replicas = ReplicaSet([replica(slots=1)])
    act = Activator(replicas)
    (r1,) = replicas.for_model(KEY)

    async def hold(end: Callable[[Slot], None]) -> None:
        slot = act.try_acquire(KEY)
        assert slot is not None and r1.in_flight == 1
        end(slot)

    trio.run(hold, (lambda s: s.give_back()) if how == "released" else (lambda s: None))
    assert r1.in_flight == 0
    assert act.dropped == (how == "dropped")  # the safety net, not the protocol
