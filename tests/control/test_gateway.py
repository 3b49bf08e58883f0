"""The data path against the fake engine: relay, retries, cooldown, deadlines, disconnects, errors."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx2
import pytest
import trio
import trio.lowlevel
import trio.testing
from prometheus_client import CollectorRegistry

from llmgw_control.api_errors import ClientApiError
from llmgw_control.gateway.config import GatewayConfig
from llmgw_control.gateway.gateway import Gateway
from llmgw_control.gateway.metrics import GatewayMetrics
from llmgw_control.gateway.relay import _read_stream
from llmgw_control.gateway.replicas import Replica, ReplicaSet
from llmgw_control.gateway.upstream import Httpx2Upstream, UpstreamError, UpstreamResponse
from llmgw_dev.engine_proc import free_port
from llmgw_dev.fake_engine import FakeEngine, FakeEngineBehavior, run_fake_engine
from support.gateway import chat_body, endpoint, running_gateway
from support.waiting import wait_until


def sse_events(text: str) -> list[Any]:
    events = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def test_chat_is_relayed_with_request_id_overhead_and_usage(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.prompt_tokens = 11
    fake_engine.behavior.chunks = 5
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        response = await gw.client.post("/v1/chat/completions", json=chat_body(), headers={"x-request-id": "abc-123"})
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 5
        assert response.headers["x-request-id"] == "abc-123"
        assert response.headers["x-llmgw-replica"] == "e1"
        assert 0 <= float(response.headers["x-llmgw-overhead-ms"]) < 1000
        assert fake_engine.observed.requests[-1].request_id == "abc-123"
        generated = await gw.client.post("/v1/chat/completions", json=chat_body())
        assert len(generated.headers["x-request-id"]) == 32
        tokens = "llmgw_tokens_total"
        assert await gw.settled_metric(tokens, {"model": "fake-model", "kind": "prompt"}, expect=22) == 22
        assert await gw.settled_metric(tokens, {"model": "fake-model", "kind": "completion"}, expect=10) == 10
        ok = {"model": "fake-model", "replica": "e1", "status": "200"}
        assert await gw.settled_metric("llmgw_requests_total", ok, expect=2) == 2


async def test_body_is_forwarded_byte_for_byte_and_client_auth_is_replaced() -> None:
    async with run_fake_engine(FakeEngineBehavior(api_key="engine-secret")) as engine:
        async with running_gateway(endpoint("e1", engine.url, api_key="engine-secret")) as gw:
            raw = b'{"model": "fake-model",  "messages": [{"role": "user", "content": "x"}], "seed": 7}'
            response = await gw.client.post(
                "/v1/chat/completions", content=raw, headers={"authorization": "Bearer client-key"}
            )
            assert response.status_code == 200
            seen = engine.observed.requests[-1]
            assert seen.headers["authorization"] == "Bearer engine-secret"
            assert seen.json["seed"] == 7


async def test_stream_is_relayed_before_the_engine_finishes(fake_engine: FakeEngine) -> None:
    # The engine stops after two chunks and keeps the connection open: a buffering proxy would
    # deliver nothing, an unbuffered one delivers both chunks.
    fake_engine.behavior.hang_mid_stream_after = 2
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        received = b""
        with trio.fail_after(10):
            async with gw.client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                async for chunk in response.aiter_bytes():
                    received += chunk
                    if received.count(b"tok1") == 1:
                        break
        assert b"tok0" in received and b"tok1" in received


async def test_stream_with_include_usage_reports_tokens(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.chunks = 4
    fake_engine.behavior.prompt_tokens = 3
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        body = chat_body(stream=True, stream_options={"include_usage": True})
        response = await gw.client.post("/v1/chat/completions", json=body)
        events = sse_events(response.text)
        assert events[-1] == "[DONE]"
        usage = [e for e in events[:-1] if e.get("usage")]
        assert usage and usage[-1]["choices"] == []
        model = {"model": "fake-model"}
        assert await gw.settled_metric("llmgw_tokens_total", {**model, "kind": "completion"}, expect=4) == 4
        assert await gw.settled_metric("llmgw_tokens_total", {**model, "kind": "prompt"}, expect=3) == 3
        assert await gw.settled_metric("llmgw_time_to_first_token_seconds_count", model, expect=1) == 1


async def test_5xx_before_first_byte_is_retried_on_another_replica_then_cooled_down() -> None:
    async with run_fake_engine(FakeEngineBehavior(status_before_body=500)) as bad, run_fake_engine() as good:
        async with running_gateway(endpoint("bad", bad.url), endpoint("good", good.url), cooldown=60) as gw:
            for _ in range(6):
                response = await gw.client.post("/v1/chat/completions", json=chat_body())
                assert response.status_code == 200
                assert response.headers["x-llmgw-replica"] == "good"
            # The bad replica was tried at most once: after its failure it is cooled down.
            assert len(bad.observed.requests) <= 1
            assert len(good.observed.requests) == 6
            if bad.observed.requests:
                assert await gw.settled_metric("llmgw_replica_cooldowns_total", {"replica": "bad"}, expect=1) == 1


async def test_refused_connection_is_retried_on_another_replica() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    async with run_fake_engine() as good:
        async with running_gateway(endpoint("dead", closed, weight=100), endpoint("good", good.url)) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat_body())
            assert response.status_code == 200
            assert response.headers["x-llmgw-replica"] == "good"
            assert await gw.settled_metric("llmgw_replica_cooldowns_total", {"replica": "dead"}, expect=1) == 1


async def test_all_replicas_failing_gives_502_naming_replica_and_phase() -> None:
    async with run_fake_engine(FakeEngineBehavior(status_before_body=503)) as bad:
        async with running_gateway(endpoint("only", bad.url)) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat_body())
            assert response.status_code == 502
            error = response.json()["error"]
            assert "only" in error["message"] and "503" in error["message"] and "first_byte" in error["message"]
            assert error["code"] == "upstream_error"
        closed = f"http://127.0.0.1:{free_port()}"
        async with running_gateway(endpoint("gone", closed)) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat_body())
            assert response.status_code == 502
            assert "gone" in response.json()["error"]["message"]
            assert "connect" in response.json()["error"]["message"]


class _FailingPool:
    """The real upstream client, except that its first ``failures`` requests fail in the pool."""

    def __init__(self, failures: int) -> None:
        self.real = Httpx2Upstream()
        self.failures = failures

    def open(self, method: str, url: str, **kwargs: Any) -> AbstractAsyncContextManager[UpstreamResponse]:
        if self.failures:
            self.failures -= 1
            # The base class, as any new kind of pool failure would be: the gateway must not
            # need to know each kind to answer it well.
            raise UpstreamError("the pool has no usable connection")
        return self.real.open(method, url, **kwargs)

    async def run(self) -> None:
        await self.real.run()

    async def aclose(self) -> None:
        await self.real.aclose()


async def test_a_pool_failure_before_the_first_byte_is_retried_elsewhere_or_a_502_never_a_500() -> None:
    async with run_fake_engine() as a, run_fake_engine() as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url), upstream=_FailingPool(1)) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat_body())
            assert response.status_code == 200
        async with running_gateway(endpoint("only", a.url), upstream=_FailingPool(10)) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat_body())
            assert response.status_code == 502
            error = response.json()["error"]
            assert "only" in error["message"] and "pool" in error["message"]


async def test_nothing_is_retried_once_bytes_reached_the_client_without_continuations() -> None:
    # With router.max_continuations (test_continuation.py) a broken stream is continued instead.
    behavior = FakeEngineBehavior(close_mid_stream_after=2)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url), max_continuations=0) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat_body(stream=True))
            assert response.status_code == 200
            events = sse_events(response.text)
            assert "[DONE]" not in events
            assert "error" in events[-1] and events[-1]["error"]["code"] == "upstream_broken"
            assert len(a.observed.requests) + len(b.observed.requests) == 1


async def test_engine_4xx_passes_through_unchanged(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.status_before_body = 400
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        async with httpx2.AsyncClient() as client:
            direct = await client.post(fake_engine.url + "/v1/chat/completions", json=chat_body())
        response = await gw.client.post("/v1/chat/completions", json=chat_body())
        assert response.status_code == 400
        assert response.content == direct.content
        assert len(fake_engine.observed.requests) == 2  # no retry of a client error


async def test_first_byte_deadline_gives_504(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.hang_before_first_byte = True
    async with running_gateway(endpoint("e1", fake_engine.url), first_byte_timeout=0.3) as gw:
        response = await gw.client.post("/v1/chat/completions", json=chat_body())
        assert response.status_code == 504
        assert "first_byte" in response.json()["error"]["message"]
        with trio.fail_after(5):
            await fake_engine.observed.wait_disconnects(1)


async def test_idle_gap_deadline_ends_the_stream_with_an_error_event(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.hang_mid_stream_after = 1
    async with running_gateway(endpoint("e1", fake_engine.url), idle_timeout=0.3) as gw:
        response = await gw.client.post("/v1/chat/completions", json=chat_body(stream=True))
        events = sse_events(response.text)
        assert events[-1]["error"]["code"] == "upstream_timeout"
        assert "body" in events[-1]["error"]["message"]


async def test_client_disconnect_mid_stream_cancels_the_upstream_request(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.chunks = 1000
    fake_engine.behavior.chunk_delay = 0.05
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        async with httpx2.AsyncClient(base_url=gw.url) as client:
            async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as response:
                async for _ in response.aiter_bytes():
                    break
        with trio.fail_after(5):
            disconnects = await fake_engine.observed.wait_disconnects(1)
        assert disconnects[0].phase == "mid_stream"
        assert disconnects[0].chunks_sent < 1000
        labels = {"model": "fake-model", "replica": "e1", "status": "499"}
        assert await gw.settled_metric("llmgw_requests_total", labels, expect=1) == 1


async def test_client_disconnect_before_first_byte_cancels_the_upstream_request(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.hang_before_first_byte = True
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        with trio.move_on_after(0.5):
            async with httpx2.AsyncClient(base_url=gw.url) as client:
                await client.post("/v1/chat/completions", json=chat_body())
        with trio.fail_after(5):
            disconnects = await fake_engine.observed.wait_disconnects(1)
        assert disconnects[0].phase == "before_first_byte"


async def test_stale_pooled_connection_is_retried_on_a_fresh_one() -> None:
    # The engine closes the connection after each stream, as llama-server does.
    async with run_fake_engine(FakeEngineBehavior(close_after_stream=True)) as engine:
        async with running_gateway(endpoint("e1", engine.url)) as gw:
            for _ in range(20):
                response = await gw.client.post("/v1/chat/completions", json=chat_body(stream=True))
                assert response.status_code == 200
                assert sse_events(response.text)[-1] == "[DONE]"


@pytest.mark.slow  # 600 requests through the gateway: a few seconds
async def test_engines_closing_keep_alive_connections_at_random_cost_no_request_and_no_replica() -> None:
    # Issue 28: the keep-alive race (an engine closing a pooled connection as it is taken or as a
    # request arrives on it) is the transport's to absorb: no client error, no retry on another
    # replica, no cooldown, whatever httpcore2 version checks idle sockets where.
    behavior = FakeEngineBehavior(chunks=4, keepalive_close_rate=0.15, keepalive_close_seed=28)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url)) as gw:
            statuses: list[int] = []

            async def client(n: int, stream: bool) -> None:
                for _ in range(n):
                    response = await gw.client.post("/v1/chat/completions", json=chat_body(stream=stream))
                    statuses.append(response.status_code)
                    if stream:
                        assert sse_events(response.text)[-1] == "[DONE]"

            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(client, 100, i % 2 == 0)
            assert statuses == [200] * 600
            assert a.observed.keepalive_closes + b.observed.keepalive_closes > 50
            assert gw.metric("llmgw_upstream_stale_resends_total") > 0
            for replica in ("a", "b"):
                assert gw.metric("llmgw_replica_cooldowns_total", {"replica": replica}) == 0
                assert gw.metric("llmgw_upstream_retries_total", {"replica": replica, "reason": "other_replica"}) == 0


async def test_models_lists_the_union_of_replicas() -> None:
    async with run_fake_engine() as a, run_fake_engine() as b:
        async with running_gateway(endpoint("a", a.url, "m1", "m2"), endpoint("b", b.url, "m2", "m3")) as gw:
            listing = (await gw.client.get("/v1/models")).json()
            assert listing["object"] == "list"
            assert [m["id"] for m in listing["data"]] == ["m1", "m2", "m3"]
            assert (await gw.client.get("/v1/models/m3")).json()["id"] == "m3"
            missing = await gw.client.get("/v1/models/nope")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
            health = await gw.client.get("/healthz")
            assert health.status_code == 200


BAD_REQUESTS: list[tuple[bytes | dict[str, Any], int, str | None]] = [
    (b"{not json", 400, "invalid_json"),
    (b"", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b"\xff\xfe", 400, "invalid_json"),
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "missing_model"),
    ({"model": 3, "messages": []}, 400, "invalid_type"),
    ({"model": "fake-model"}, 400, "missing_required_parameter"),
    ({"model": "fake-model", "messages": "hi"}, 400, "invalid_type"),
    ({"model": "fake-model", "messages": []}, 400, "invalid_value"),
    ({"model": "fake-model", "messages": ["hi"]}, 400, "invalid_type"),
    (chat_body(max_tokens="10"), 400, "invalid_type"),
    (chat_body(max_tokens=True), 400, "invalid_type"),
    (chat_body(max_tokens=-1), 400, "invalid_value"),
    (chat_body(stream="yes"), 400, "invalid_type"),
    (chat_body(temperature="hot"), 400, "invalid_type"),
    (chat_body(model="no-such-model"), 404, "model_not_found"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD_REQUESTS)
async def test_bad_requests_get_openai_shaped_errors(
    fake_engine: FakeEngine, body: bytes | dict[str, Any], status: int, code: str | None
) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        if isinstance(body, bytes):
            response = await gw.client.post("/v1/chat/completions", content=body)
        else:
            response = await gw.client.post("/v1/chat/completions", json=body)
        assert response.status_code == status
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == code
        assert error["message"]
        assert fake_engine.observed.requests == []


async def test_unknown_model_error_names_the_models_that_exist(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url, "alpha", "beta")) as gw:
        response = await gw.client.post("/v1/chat/completions", json=chat_body(model="gamma"))
        message = response.json()["error"]["message"]
        assert "gamma" in message and "alpha" in message and "beta" in message


async def test_body_over_the_limit_is_refused_with_413(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url), max_body_bytes=4096) as gw:
        big = chat_body(messages=[{"role": "user", "content": "x" * 8000}])
        response = await gw.client.post("/v1/chat/completions", json=big)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"

        # Without a content-length (chunked upload) the limit still holds.
        async def chunks() -> Any:
            for _ in range(10):
                yield b"x" * 1000

        response = await gw.client.post("/v1/chat/completions", content=chunks())
        assert response.status_code == 413
        assert fake_engine.observed.requests == []


async def test_wrong_method_and_unknown_path(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        response = await gw.client.get("/v1/chat/completions")
        assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"
        response = await gw.client.post("/v1/nothing-here", json={})
        assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_url"


async def test_completions_and_embeddings_are_routed(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        response = await gw.client.post("/v1/completions", json={"model": "fake-model", "prompt": "hi"})
        assert response.status_code == 200 and response.json()["object"] == "text_completion"
        response = await gw.client.post("/v1/embeddings", json={"model": "fake-model", "input": ["a", "b"]})
        assert response.status_code == 200 and len(response.json()["data"]) == 2
        paths = [r.path for r in fake_engine.observed.requests]
        assert paths == ["/v1/completions", "/v1/embeddings"]


async def test_least_in_flight_spreads_concurrent_streams() -> None:
    behavior = FakeEngineBehavior(hang_mid_stream_after=1)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url)) as gw:
            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(_open_stream, gw.url)
                await wait_until(lambda: a.observed.in_flight + b.observed.in_flight >= 6, timeout=10, interval=0.01)
                assert a.observed.in_flight == 3 and b.observed.in_flight == 3
                nursery.cancel_scope.cancel()


async def _open_stream(url: str) -> None:
    async with httpx2.AsyncClient(base_url=url) as client:
        async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as response:
            async for _ in response.aiter_bytes():
                pass


async def test_metrics_on_admin_and_metrics_only_listeners(fake_engine: FakeEngine) -> None:
    port = free_port()
    async with running_gateway(endpoint("e1", fake_engine.url), metrics_listen=f"127.0.0.1:{port}") as gw:
        await gw.client.post("/v1/chat/completions", json=chat_body())
        for base in (gw.listening.admin_url, gw.listening.metrics_url):
            assert base is not None
            async with httpx2.AsyncClient(base_url=base) as client:
                text = (await client.get("/metrics")).text
            for name in (
                "llmgw_requests_total",
                "llmgw_request_duration_seconds_bucket",
                "llmgw_overhead_seconds_bucket",
                "llmgw_requests_in_flight",
                "llmgw_tokens_total",
            ):
                assert name in text
        # The client port does not expose metrics.
        assert (await gw.client.get("/metrics")).status_code == 404


async def test_a_client_that_hangs_up_right_after_done_is_not_an_abort(fake_engine: FakeEngine) -> None:
    # The openai client closes its connection as soon as it reads [DONE], which can beat the
    # gateway's final empty write: the request is still complete and its usage still counts.
    fake_engine.behavior.chunks = 3
    fake_engine.behavior.prompt_tokens = 4
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        for _ in range(20):
            async with httpx2.AsyncClient(base_url=gw.url) as client:
                body = chat_body(stream=True, stream_options={"include_usage": True})
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    received = b""
                    async for chunk in response.aiter_bytes():
                        received += chunk
                        if b"[DONE]" in received:
                            break
        ok = {"model": "fake-model", "replica": "e1", "status": "200"}
        assert await gw.settled_metric("llmgw_requests_total", ok, expect=20) == 20
        tokens = {"model": "fake-model", "kind": "completion"}
        assert await gw.settled_metric("llmgw_tokens_total", tokens, expect=60) == 60


class _InstantStream:
    """An engine answer whose chunks are all there at once, as when the client is the slow side."""

    status_code = 200

    def __init__(self, chunks: int, then_stall: bool = False) -> None:
        self._left = chunks
        self._then_stall = then_stall

    def content_type(self) -> str:
        return "text/event-stream"

    async def next_chunk(self) -> bytes | None:
        await trio.lowlevel.checkpoint()
        if self._left == 0:
            if self._then_stall:
                await trio.sleep_forever()
            return None
        self._left -= 1
        return b'data: {"x": 1}\n\n'


def _stream_gateway(idle_timeout: float) -> Gateway:
    return Gateway(
        ReplicaSet(),
        upstream=None,  # type: ignore[arg-type]
        metrics=GatewayMetrics(CollectorRegistry()),
        config=GatewayConfig(idle_timeout=idle_timeout),
    )


async def test_a_client_slower_than_the_engine_is_not_an_idle_engine(autojump_clock: trio.testing.MockClock) -> None:
    # 500 chunks against a queue of 64: the reader waits on the full queue while the client
    # takes 2 s per read, far past the 1 s idle timeout. That wait is the client's, not the engine's.
    gateway = _stream_gateway(idle_timeout=1.0)
    arrived, collected = trio.open_memory_channel[Any](64)
    replica = Replica("r1", "http://r1", frozenset({"m"}))
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_read_stream, gateway.config, replica, _InstantStream(500), arrived)
        async with collected:
            async for item in collected:
                got.append(item)
                if len(got) % 100 == 0:
                    await trio.sleep(2.0)
    assert len(got) == 501
    assert got[-1] is None


async def test_an_engine_that_stops_sending_is_cut_after_the_idle_timeout_not_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gateway = _stream_gateway(idle_timeout=1.0)
    arrived, collected = trio.open_memory_channel[Any](64)
    replica = Replica("r1", "http://r1", frozenset({"m"}))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_read_stream, gateway.config, replica, _InstantStream(3, then_stall=True), arrived)
        async with collected:
            items = [item async for item in collected]
            stalled_for = trio.current_time()
    assert items[:3] == [b'data: {"x": 1}\n\n'] * 3
    assert isinstance(items[-1], ClientApiError) and items[-1].status == 504
    # Cut between idle_timeout and idle_timeout + its slack (a tenth of it) after the last chunk.
    assert 1.0 <= stalled_for <= 1.0 + 0.1 + 0.01
