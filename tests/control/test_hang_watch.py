"""The hang watch (gateway/hang_watch.py) with fakes: an engine that accepts connections and answers
nothing (a hung one) is withdrawn and its waiting requests moved; an engine slow to its first token
whose /health answers is never withdrawn, however long its silence."""

from __future__ import annotations

from functools import partial

import pytest
import trio

from llmgw_control.gateway.progress import Progress
from llmgw_dev.fake_engine import FakeEngineBehavior, run_fake_engine
from support.gateway import chat_body, endpoint, running_gateway

# Tight bounds so the tests take a second or two: suspected after 0.3 s of silence, /health given 0.3 s.
FAST = {"hang_suspect_after": 0.3, "hang_probe_timeout": 0.3, "hang_check_every": 0.05, "hung_probe_every": 0.2}


async def _silent(stream: trio.SocketStream) -> None:
    """A hung engine: the connection is accepted (the kernel does that for a stopped process too),
    the request read, nothing ever answered."""
    async with stream:
        while await stream.receive_some(65536):
            pass


async def test_a_silent_engine_is_withdrawn_and_its_waiting_requests_moved(nursery: trio.Nursery) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    nursery.start_soon(partial(trio.serve_listeners, _silent, listeners))
    async with (
        run_fake_engine() as good,
        running_gateway(
            endpoint("hung", f"http://127.0.0.1:{port}", slots=4),
            endpoint("good", good.url, slots=4),
            routing="least-loaded",
            **FAST,
        ) as gw,
    ):
        answers: list[tuple[int, str]] = []

        async def ask(stream: bool) -> None:
            response = await gw.client.post("/v1/chat/completions", json=chat_body(stream=stream))
            answers.append((response.status_code, response.headers.get("x-llmgw-replica", "")))

        with trio.fail_after(5):
            async with trio.open_nursery() as requests:
                for i in range(4):
                    requests.start_soon(ask, bool(i % 2))
        # Two went to the silent engine first (least-loaded alternates): both moved, none failed.
        assert answers and all(status == 200 for status, _ in answers), answers
        assert {replica for _, replica in answers} == {"good"}
        assert gw.metric("llmgw_replica_hangs_total", {"replica": "hung"}) == 1
        assert gw.metric("llmgw_replicas_hung") == 1
        # Withdrawn: later requests go to the other replica without waiting on it.
        with trio.fail_after(1):
            response = await gw.client.post("/v1/chat/completions", json=chat_body())
        assert response.headers["x-llmgw-replica"] == "good"


@pytest.mark.slow
async def test_an_engine_slow_to_its_first_token_is_never_withdrawn() -> None:
    # Five times the silence that makes it suspect: /health answers every time, so it is slow, not hung.
    async with (
        run_fake_engine(FakeEngineBehavior(first_byte_delay=1.5)) as slow,
        running_gateway(
            endpoint("slow", slow.url),
            **FAST,
        ) as gw,
    ):
        answers = {}

        async def ask(stream: bool) -> None:
            answers[stream] = await gw.client.post("/v1/chat/completions", json=chat_body(stream=stream))

        with trio.fail_after(10):
            async with trio.open_nursery() as requests:
                requests.start_soon(ask, True)
                requests.start_soon(ask, False)
        stream, plain = answers[True], answers[False]
        assert stream.status_code == 200 and "[DONE]" in stream.text and '"error"' not in stream.text
        assert plain.status_code == 200
        assert gw.metric("llmgw_replica_hangs_total", {"replica": "slow"}) == 0
        assert gw.metric("llmgw_replicas_hung") == 0


async def test_a_wait_on_a_replica_already_hung_is_cancelled_at_once() -> None:
    progress = Progress()
    progress.hung_since = trio.current_time()
    with trio.CancelScope() as scope:
        progress.wait(scope)
        await trio.sleep(10)
    assert scope.cancelled_caught
    progress.done(scope)
    assert not progress.waiting


async def test_silence_is_counted_from_the_first_wait_not_from_the_last_answer() -> None:
    progress = Progress()
    progress.last = trio.current_time() - 3600  # idle for an hour
    scope = trio.CancelScope()
    progress.wait(scope)
    assert not progress.suspect(trio.current_time(), 3.0)
    assert progress.suspect(trio.current_time() + 3.0, 3.0)
