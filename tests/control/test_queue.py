"""Capacity-aware admission end to end: the real gateway over sockets in front of the fake engine.

A replica gets at most its slots; the rest wait in the gateway's queue (reported as queue time,
not overhead), overflow with 429, time out with 503, leave it when their client goes, and are
served interactive before batch.
"""

from __future__ import annotations

from typing import Any

import httpx2
import trio

from llmgw_control.gateway.activator import ActivatorConfig
from llmgw_dev.fake_engine import FakeEngine
from support.gateway import RunningGateway, chat_body, endpoint, running_gateway
from support.waiting import wait_until

IN_FLIGHT = "llmgw_requests_in_flight"
MODEL = {"model": "fake-model"}


async def _post(
    gw: RunningGateway,
    into: list[httpx2.Response],
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    async with httpx2.AsyncClient(base_url=gw.url, timeout=30) as client:
        into.append(await client.post("/v1/chat/completions", json=body or chat_body(), headers=headers))


class Clients:
    """Requests started in a nursery that can all be made to give up at once."""

    def __init__(self, nursery: trio.Nursery, gw: RunningGateway) -> None:
        self._nursery = nursery
        self._gw = gw
        self._scopes: list[trio.CancelScope] = []

    def start(
        self,
        into: list[httpx2.Response] | None = None,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        scope = trio.CancelScope()
        self._scopes.append(scope)

        async def run() -> None:
            with scope:
                await _post(self._gw, [] if into is None else into, body, headers)

        self._nursery.start_soon(run)

    def give_up(self) -> None:
        for scope in self._scopes:
            scope.cancel()


async def _in_gateway(gw: RunningGateway, count: int) -> None:
    """Until ``count`` requests are inside the gateway (holding a slot or queued)."""
    await wait_until(lambda: gw.metric(IN_FLIGHT, MODEL) == count, timeout=10, interval=0.01)


async def test_a_replica_gets_at_most_its_slots_and_the_rest_wait_in_the_gateway(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.hang_before_first_byte = True
    async with running_gateway(endpoint("e1", fake_engine.url, slots=2)) as gw:
        held: list[httpx2.Response] = []
        queued: list[httpx2.Response] = []
        async with trio.open_nursery() as nursery:
            holders = Clients(nursery, gw)
            for _ in range(2):
                holders.start(held)
            with trio.fail_after(10):
                await fake_engine.observed.wait_for(lambda o: o.in_flight == 2)
            for _ in range(3):
                nursery.start_soon(_post, gw, queued)
            await _in_gateway(gw, 5)
            assert fake_engine.observed.in_flight == 2  # the other three wait in the gateway, not the engine
            fake_engine.behavior.hang_before_first_byte = False
            holders.give_up()  # their clients go: the slots pass to the queue
        assert held == []
        assert [r.status_code for r in queued] == [200] * 3
        assert fake_engine.observed.max_in_flight == 2
        for response in queued:
            assert float(response.headers["x-llmgw-queued-ms"]) > 0
        assert gw.metric("llmgw_queue_wait_seconds_count", MODEL) == 3


async def test_a_full_queue_gets_429_and_a_wait_over_max_wait_gets_503(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.hang_before_first_byte = True
    queue = ActivatorConfig(queue_size=1, max_wait=0.5)
    async with running_gateway(endpoint("e1", fake_engine.url, slots=1), activator=queue) as gw:
        answers: list[httpx2.Response] = []
        async with trio.open_nursery() as nursery:
            holder = Clients(nursery, gw)
            holder.start()
            with trio.fail_after(10):
                await fake_engine.observed.wait_for(lambda o: o.in_flight == 1)
            nursery.start_soon(_post, gw, answers)  # waits, and times out after max_wait
            await _in_gateway(gw, 2)
            await _post(gw, answers)  # the queue (of one) is full
            overflow = answers.pop()
            assert overflow.status_code == 429
            assert overflow.json()["error"]["code"] == "model_queue_full"
            assert overflow.json()["error"]["type"] == "rate_limit_error"
            assert int(overflow.headers["retry-after"]) > 0
            assert "x-llmgw-queued-ms" not in overflow.headers  # turned away at once: it never waited
            await wait_until(lambda: answers, timeout=10, interval=0.01)
            (timed_out,) = answers
            assert timed_out.status_code == 503
            error = timed_out.json()["error"]
            assert error["code"] == "model_overloaded" and "1 slot(s)" in error["message"]
            assert set(error) == {"message", "type", "param", "code"}
            holder.give_up()
        refusals = "llmgw_queue_refusals_total"
        assert gw.metric(refusals, {**MODEL, "reason": "overflow"}) == 1
        assert gw.metric(refusals, {**MODEL, "reason": "timeout"}) == 1
        assert gw.metric("llmgw_queue_wait_seconds_count", MODEL) == 1  # the one that waited


async def test_a_client_that_gives_up_while_queued_takes_no_slot_with_it(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.hang_before_first_byte = True
    async with running_gateway(endpoint("e1", fake_engine.url, slots=2)) as gw:
        async with trio.open_nursery() as nursery:
            everyone = Clients(nursery, gw)
            for _ in range(6):
                everyone.start()
            await _in_gateway(gw, 6)
            everyone.give_up()  # two in the engine, four queued: all go
        await _in_gateway(gw, 0)
        with trio.fail_after(10):
            await fake_engine.observed.wait_for(lambda o: o.in_flight == 0)
        # Both slots are free again: two new requests reach the engine at once.
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(_post, gw, [])
            with trio.fail_after(10):
                await fake_engine.observed.wait_for(lambda o: o.in_flight == 2)
            nursery.cancel_scope.cancel()


async def test_interactive_requests_are_served_before_batch_ones(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.hang_before_first_byte = True
    async with running_gateway(endpoint("e1", fake_engine.url, slots=1)) as gw:
        service = gw.tenancy.service
        org = await service.create_group("org")
        batch = await service.create_group("nightly", org.id, priority="batch")
        interactive = await service.create_key(name="chat", group_id=org.id)
        # A key in a group below "nightly" inherits its priority.
        reports = await service.create_group("reports", batch.id)
        offline = await service.create_key(name="offline", group_id=reports.id)
        assert gw.tenancy.state.priority(reports.id).label == "batch"

        def auth(key: Any) -> dict[str, str]:
            return {"authorization": f"Bearer {key.secret}"}

        def tagged(tag: str) -> dict[str, Any]:
            return chat_body(messages=[{"role": "user", "content": tag}])

        answers: list[httpx2.Response] = []
        async with trio.open_nursery() as nursery:
            holder = Clients(nursery, gw)
            holder.start(None, tagged("holder"), auth(interactive))
            with trio.fail_after(10):
                await fake_engine.observed.wait_for(lambda o: o.in_flight == 1)
            nursery.start_soon(_post, gw, answers, tagged("batch"), auth(offline))
            await _in_gateway(gw, 2)
            nursery.start_soon(_post, gw, answers, tagged("interactive"), auth(interactive))
            await _in_gateway(gw, 3)
            fake_engine.behavior.hang_before_first_byte = False
            holder.give_up()
        served = [r.json["messages"][0]["content"] for r in fake_engine.observed.requests]
        assert served == ["holder", "interactive", "batch"]  # the batch request came first, and waited
        assert [r.status_code for r in answers] == [200, 200]
