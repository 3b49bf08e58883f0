"""The gateway in front of the real llama-server, driven by the official openai client.

The openai client is synchronous here and runs in a worker thread, so the gateway (in this
test's trio loop) keeps serving while the client blocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import openai
import pytest
import trio

from llmgw_dev.engine_proc import LlamaServer, llama_server_process
from support.gateway import RunningGateway, endpoint, running_gateway
from support.waiting import wait_until

T = TypeVar("T")
pytestmark = pytest.mark.engine


async def in_thread(call: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(call)


@pytest.fixture
async def gateway(real_engine: LlamaServer, real_embedding_engine: LlamaServer) -> AsyncIterator[RunningGateway]:
    async with running_gateway(
        endpoint("chat", real_engine.url, "tiny"), endpoint("embed", real_embedding_engine.url, "tiny-embed")
    ) as gw:
        yield gw


def client_for(gw: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="not-needed", max_retries=0, timeout=60)


async def test_chat_completion(gateway: RunningGateway) -> None:
    client = client_for(gateway)
    reply = await in_thread(
        lambda: client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Say something"}], max_tokens=12
        )
    )
    assert reply.model == "tiny"
    assert reply.choices[0].finish_reason == "length"
    assert isinstance(reply.choices[0].message.content, str) and reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    labels = {"model": "tiny", "kind": "completion"}
    assert await gateway.settled_metric("llmgw_tokens_total", labels, expect=12) == 12


async def test_chat_streaming_with_usage(gateway: RunningGateway) -> None:
    client = client_for(gateway)

    def stream() -> list[Any]:
        return list(
            client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Stream please"}],
                max_tokens=10,
                stream=True,
                stream_options={"include_usage": True},
            )
        )

    chunks = await in_thread(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10
    labels = {"model": "tiny", "kind": "completion"}
    assert await gateway.settled_metric("llmgw_tokens_total", labels, expect=10) == 10


async def test_completions_plain_and_streamed(gateway: RunningGateway) -> None:
    client = client_for(gateway)
    reply = await in_thread(lambda: client.completions.create(model="tiny", prompt="Once upon", max_tokens=6))
    assert reply.choices[0].text and reply.usage is not None and reply.usage.completion_tokens == 6
    chunks = await in_thread(
        lambda: list(client.completions.create(model="tiny", prompt="Once upon", max_tokens=6, stream=True))
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices)


async def test_embeddings(gateway: RunningGateway) -> None:
    client = client_for(gateway)
    result = await in_thread(lambda: client.embeddings.create(model="tiny-embed", input=["hello", "world"]))
    assert len(result.data) == 2
    assert len(result.data[0].embedding) == 64  # the tiny model's n_embd
    assert result.data[0].embedding != result.data[1].embedding


async def test_models(gateway: RunningGateway) -> None:
    client = client_for(gateway)
    listing = await in_thread(lambda: client.models.list())
    assert sorted(m.id for m in listing.data) == ["tiny", "tiny-embed"]
    assert (await in_thread(lambda: client.models.retrieve("tiny"))).id == "tiny"


async def test_errors_reach_the_client_in_openai_shape(gateway: RunningGateway) -> None:
    client = client_for(gateway)
    with pytest.raises(openai.NotFoundError) as missing:
        await in_thread(
            lambda: client.chat.completions.create(model="gpt-17", messages=[{"role": "user", "content": "x"}])
        )
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await in_thread(
            lambda: client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens="many"
            )
        )  # type: ignore[arg-type]
    assert bad.value.code == "invalid_type"
    # A prompt longer than the slot's context: the engine's own 400 passes through unchanged.
    with pytest.raises(openai.BadRequestError) as overflow:
        await in_thread(
            lambda: client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "lorem ipsum " * 600}], max_tokens=4
            )
        )
    assert overflow.value.status_code == 400
    assert "context" in str(overflow.value.message).lower()


@pytest.fixture(scope="module")
def long_context_engine(llama_server_binary: Path, tiny_model: Path) -> Iterator[LlamaServer]:
    """One slot with a long context, so a generation lasts long enough to be cut off."""
    with llama_server_process(
        llama_server_binary, tiny_model, alias="tiny-long", extra_args=["-c", "2048", "-np", "1"]
    ) as server:
        yield server


async def _predicted_tokens(url: str) -> float:
    async with httpx2.AsyncClient() as client:
        text = (await client.get(url + "/metrics")).text
    for line in text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total"):
            return float(line.split()[-1])
    raise AssertionError("llama-server reported no tokens_predicted_total")


async def test_client_disconnect_stops_generation_in_the_real_engine(long_context_engine: LlamaServer) -> None:
    engine = long_context_engine
    before = await _predicted_tokens(engine.url)
    async with running_gateway(endpoint("long", engine.url, "tiny-long")) as gw:
        body = {
            "model": "tiny-long",
            "messages": [{"role": "user", "content": "go"}],
            "max_tokens": 1900,
            "stream": True,
        }
        async with httpx2.AsyncClient(base_url=gw.url) as client:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                async for _ in response.aiter_bytes():
                    break

        # The slot frees up once the engine notices the closed connection.
        async def idle() -> bool:
            async with httpx2.AsyncClient() as probe:
                slots = (await probe.get(engine.url + "/slots")).json()
            return not any(slot["is_processing"] for slot in slots)

        await wait_until(idle, timeout=10, interval=0.02)
    generated = await _predicted_tokens(engine.url) - before
    assert generated < 1900, f"the engine generated {generated} tokens: it was not told the client left"


async def test_requests_after_a_client_aborted_its_stream_are_all_answered(
    real_engine: LlamaServer, long_context_engine: LlamaServer
) -> None:
    # Issue 28: in front of two llama-servers, a request after a client aborted its stream failed
    # on httpcore2 2.17 (a pooled connection llama-server had closed). Every request is answered,
    # and nothing is counted against a replica.
    async with (
        running_gateway(endpoint("a", real_engine.url, "tiny"), endpoint("b", long_context_engine.url, "tiny")) as gw,
        httpx2.AsyncClient(base_url=gw.url, timeout=60) as client,
    ):
        statuses = []
        for round_ in range(6):
            body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": 200, "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                async for _ in response.aiter_bytes():
                    break  # the client aborts mid-stream
            for stream in (False, True, False, True):
                body = {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"hi {round_}"}],
                    "max_tokens": 3,
                    "stream": stream,
                }
                statuses.append((await client.post("/v1/chat/completions", json=body)).status_code)
        assert statuses == [200] * 24
        for replica in ("a", "b"):
            assert gw.metric("llmgw_replica_cooldowns_total", {"replica": replica}) == 0


@pytest.mark.slow  # waits out llama-server's keep-alive timeout (5 s)
async def test_connections_llama_server_closed_while_idle_cost_no_request(real_engine: LlamaServer) -> None:
    # Issue 28, the mechanism: llama-server closes idle keep-alive connections after 5 s. With
    # httpcore2 2.17 the pool took those for live ones, and the gateway's second try took the next
    # dead one: a 502 with nothing wrong. Several pooled connections, an idle pause, then traffic.
    async with (
        running_gateway(endpoint("a", real_engine.url, "tiny")) as gw,
        httpx2.AsyncClient(base_url=gw.url, timeout=60) as client,
    ):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for pause in (0.0, 6.0):
            await trio.sleep(pause)
            statuses: list[int] = []

            async def one() -> None:
                statuses.append((await client.post("/v1/chat/completions", json=body)).status_code)  # noqa: B023

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(one)
            assert statuses == [200] * 4, pause
        assert gw.metric("llmgw_replica_cooldowns_total", {"replica": "a"}) == 0
