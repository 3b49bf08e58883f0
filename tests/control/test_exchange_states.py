"""An exchange's one state (gateway/exchange.py): the moves each way of answering makes, an illegal
one raising, and every move the gateway takes while serving in the table."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from llmgw_control.api_errors import ClientApiError
from llmgw_control.gateway.exchange import EXCHANGE_LIFECYCLE, Exchange, ExchangeState, IllegalTransition
from llmgw_dev.fake_engine import FakeEngineBehavior, run_fake_engine
from support.gateway import chat_body, endpoint, running_gateway


async def _ignore(message: Any) -> None:
    pass


def _recording(exchange: Exchange) -> list[ExchangeState]:
    seen = [exchange.state]
    move = exchange.move

    def recorded(to: ExchangeState) -> None:
        move(to)
        if exchange.state is not seen[-1]:
            seen.append(exchange.state)

    exchange.move = recorded  # type: ignore[method-assign]
    return seen


async def test_a_whole_answer() -> None:
    exchange = Exchange(_ignore, "r")
    seen = _recording(exchange)
    await exchange.respond(200, b"{}")
    assert seen == [ExchangeState.IDLE, ExchangeState.HEAD_SENT, ExchangeState.COMPLETE]
    assert exchange.response_started and exchange.complete and not exchange.client_gone


async def test_a_stream_and_its_error_event() -> None:
    exchange = Exchange(_ignore, "r")
    await exchange.start_stream(200, b"text/event-stream")
    assert exchange.state is ExchangeState.HEAD_SENT and exchange.response_started and not exchange.complete
    await exchange.send_chunk(b"data: {}\n\n")
    assert exchange.state is ExchangeState.STREAMING
    await exchange.send_error(ClientApiError(502, "broke off"))
    assert exchange.state is ExchangeState.STREAMING and exchange.status == 502
    await exchange.end_stream()
    assert exchange.state is ExchangeState.COMPLETE


async def test_a_client_gone_before_or_after_the_head() -> None:
    before = Exchange(_ignore, "r")
    before.client_gone = True
    assert before.client_gone and not before.response_started
    after = Exchange(_ignore, "r")
    await after.start_stream(200, b"text/event-stream")
    after.client_gone = True
    # Its tokens were served in part: the quota settles them (gateway.py _settle reads this).
    assert after.client_gone and after.response_started
    # What the relay was already doing changes nothing any more.
    after.complete = True
    assert after.client_gone


async def test_a_second_response_head_is_illegal() -> None:
    exchange = Exchange(_ignore, "r")
    await exchange.respond(200, b"{}")
    with pytest.raises(IllegalTransition):
        await exchange.start_stream(200, b"text/event-stream")
    with pytest.raises(IllegalTransition):
        exchange.client_gone = True


async def test_every_move_the_gateway_takes_is_in_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: set[tuple[ExchangeState, ExchangeState]] = set()
    move = Exchange.move

    def recorded(self: Exchange, to: ExchangeState) -> None:
        before = self.state
        move(self, to)
        if self.state is not before:
            taken.add((before, self.state))

    monkeypatch.setattr(Exchange, "move", recorded)
    async with (
        run_fake_engine(FakeEngineBehavior(chunks=20, chunk_delay=0.01)) as engine,
        running_gateway(endpoint("r1", engine.url)) as gw,
    ):
        assert (await gw.client.post("/v1/chat/completions", json=chat_body())).status_code == 200
        assert (await gw.client.post("/v1/chat/completions", json=chat_body(stream=True))).status_code == 200
        assert (await gw.client.get("/nowhere")).status_code == 404
        # A client that hangs up mid-stream.
        async with gw.client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as response:
            async for _ in response.aiter_bytes():
                break
        engine.behavior.status_before_body = 400
        assert (await gw.client.post("/v1/chat/completions", json=chat_body())).status_code == 400
        await trio.sleep(0.2)
    legal = {(state, to) for state, moves in EXCHANGE_LIFECYCLE.transitions.items() for to in moves}
    assert taken <= legal, taken - legal
    # The paths above took these at least.
    assert {
        (ExchangeState.IDLE, ExchangeState.HEAD_SENT),
        (ExchangeState.HEAD_SENT, ExchangeState.COMPLETE),
        (ExchangeState.HEAD_SENT, ExchangeState.STREAMING),
        (ExchangeState.STREAMING, ExchangeState.COMPLETE),
    } <= taken
