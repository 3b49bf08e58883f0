"""The APIs agents speak, through the gateway to two real llama-servers, with the official clients.

The anthropic SDK (Messages with ``x-api-key`` and with a Bearer ``auth_token``, ``.stream``,
``count_tokens``, its exception classes), the openai SDK's ``responses`` (plain and streamed),
openai-agents with its default model (the Responses API), and the engine's own routes. Every call
uses a key; the key's recorded usage must equal the sum of what the replies said, and a token
quota must answer 429 on Messages and on Responses. The clients are synchronous here and run in a
worker thread, so the gateway (in this test's trio loop) keeps serving while they block.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anthropic
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


@pytest.fixture(scope="module")
def rerank_engine(llama_server_binary: Path, tiny_model: Path) -> Iterator[LlamaServer]:
    """A third llama-server with ``--reranking`` (the chat ones answer /v1/rerank with 501)."""
    with llama_server_process(
        llama_server_binary, tiny_model, alias="tiny-rerank", extra_args=["--reranking"]
    ) as server:
        yield server


@pytest.fixture
async def gateway(
    real_engine: LlamaServer, real_embedding_engine: LlamaServer, rerank_engine: LlamaServer
) -> AsyncIterator[RunningGateway]:
    # Two replicas of "tiny" (b11312 with --embeddings still serves chat), and a reranker.
    async with running_gateway(
        endpoint("a", real_engine.url, "tiny"),
        endpoint("b", real_embedding_engine.url, "tiny"),
        endpoint("r", rerank_engine.url, "ranker"),
    ) as gw:
        yield gw


async def key(
    gw: RunningGateway, name: str, quota: dict[str, int] | None = None, models: list[str] | None = None
) -> tuple[str, str]:
    """A new key in a group of its own: (secret, group id)."""
    service = gw.tenancy.service
    group = await service.create_group(name)
    if quota:
        await service.set_quota(group.id, quota)
    created = await service.create_key(name=name, group_id=group.id, models=models)
    return created.secret, group.id


@pytest.mark.slow  # about 1.5 s: a dozen real generations through three engines
async def test_messages_responses_and_engine_routes_with_usage_per_key(gateway: RunningGateway) -> None:
    secret, group = await key(gateway, "agents")
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=secret, max_retries=0, timeout=60)
    bearer = anthropic.Anthropic(base_url=gateway.url, auth_token=secret, max_retries=0, timeout=60)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0, timeout=60)
    spent = [0, 0]  # prompt, completion: what the replies said

    def count(prompt: int, completion: int) -> None:
        spent[0] += prompt
        spent[1] += completion

    system = "You are terse."
    for sdk in (claude, bearer):
        reply = await in_thread(
            lambda sdk=sdk: sdk.messages.create(  # type: ignore[misc]
                model="tiny", max_tokens=6, system=system, messages=[{"role": "user", "content": "Say hi"}]
            )
        )
        assert reply.type == "message" and reply.content and reply.usage.output_tokens == 6
        count(reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0), reply.usage.output_tokens)

    def stream() -> tuple[str, Any]:
        with claude.messages.stream(model="tiny", max_tokens=5, messages=[{"role": "user", "content": "Go"}]) as s:
            text = "".join(s.text_stream)
            return text, s.get_final_message()

    text, final = await in_thread(stream)
    assert text and final.usage.output_tokens == 5 and final.usage.input_tokens > 0
    count(final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0), final.usage.output_tokens)
    counted = await in_thread(
        lambda: claude.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": "Count me"}])
    )
    assert counted.input_tokens > 0  # the tokenizer only: no tokens of any quota

    response = await in_thread(lambda: client.responses.create(model="tiny", input="Hello", max_output_tokens=4))
    assert response.output_text and response.usage is not None and response.usage.output_tokens == 4
    count(response.usage.input_tokens, response.usage.output_tokens)

    def responses_stream() -> list[Any]:
        return list(client.responses.create(model="tiny", input="Hello again", max_output_tokens=4, stream=True))

    events = await in_thread(responses_stream)
    completed = [e for e in events if e.type == "response.completed"]
    assert any(e.type == "response.output_text.delta" for e in events) and len(completed) == 1
    usage = completed[0].response.usage
    count(usage.input_tokens, usage.output_tokens)

    # The engine's own routes, by model, with the same key.
    http = gateway.client
    auth = {"authorization": f"Bearer {secret}"}
    tokens = await http.post("/tokenize", json={"model": "tiny", "content": "hello"}, headers=auth)
    assert tokens.status_code == 200 and tokens.json()["tokens"]
    text_back = await http.post("/detokenize", json={"model": "tiny", "tokens": tokens.json()["tokens"]}, headers=auth)
    assert text_back.status_code == 200 and "hello" in text_back.json()["content"]
    conversation = [{"role": "user", "content": "hi"}]
    template = await http.post("/apply-template", json={"model": "tiny", "messages": conversation}, headers=auth)
    assert template.status_code == 200 and "hi" in template.json()["prompt"]
    for path in ("/v1/rerank", "/rerank"):
        ranked = await http.post(path, json={"model": "ranker", "query": "a", "documents": ["b", "c"]}, headers=auth)
        assert ranked.status_code == 200 and len(ranked.json()["results"]) == 2
        count(ranked.json()["usage"]["prompt_tokens"], 0)
    # The chat models serve neither: the engine's 501 is the caller's 400, asked of one replica once.
    for path, body in (("/v1/rerank", {"query": "a", "documents": ["b"]}), ("/infill", {"input_prefix": "def f("})):
        refused = await http.post(path, json={"model": "tiny", **body}, headers=auth)
        assert refused.status_code == 400 and refused.headers["x-should-retry"] == "false", refused.text
    assert gateway.metric("llmgw_replica_cooldowns_total", {"replica": "a"}) == 0
    assert gateway.metric("llmgw_replica_cooldowns_total", {"replica": "b"}) == 0
    assert gateway.metric("llmgw_retries_total", {"replica": "a", "reason": "other_replica"}) == 0
    assert gateway.metric("llmgw_retries_total", {"replica": "b", "reason": "other_replica"}) == 0
    assert gateway.metric("llmgw_api_requests_total", {"api": "messages", "status": "200"}) == 3
    assert gateway.metric("llmgw_api_requests_total", {"api": "responses", "status": "200"}) == 2

    async def settled() -> bool:
        totals = await gateway.tenancy.service.usage_totals(group_id=group)
        return [totals.prompt_tokens, totals.completion_tokens] == spent

    with trio.move_on_after(10):
        await wait_until(settled, timeout=11)
    totals = await gateway.tenancy.service.usage_totals(group_id=group)
    assert [totals.prompt_tokens, totals.completion_tokens] == spent


async def test_anthropic_exceptions_and_token_quotas(gateway: RunningGateway) -> None:
    secret, _ = await key(gateway, "limited", quota={"tokens_per_minute": 60}, models=["tiny"])
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=secret, max_retries=0, timeout=60)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0, timeout=60)
    message = {"role": "user", "content": "hi"}
    with pytest.raises(anthropic.AuthenticationError):
        await in_thread(
            lambda: anthropic.Anthropic(base_url=gateway.url, api_key="sk-llmgw-wrong", max_retries=0).messages.create(
                model="tiny", max_tokens=2, messages=[message]
            )
        )
    with pytest.raises(anthropic.NotFoundError):
        await in_thread(lambda: claude.messages.create(model="no-such-model", max_tokens=2, messages=[message]))
    with pytest.raises(anthropic.PermissionDeniedError):
        await in_thread(lambda: claude.messages.create(model="ranker", max_tokens=2, messages=[message]))
    with pytest.raises(anthropic.BadRequestError):
        await in_thread(lambda: claude.messages.create(model="tiny", max_tokens=-1, messages=[message]))
    # The quota: one answer of 40 tokens fits, the next reservation does not.
    served = await in_thread(lambda: claude.messages.create(model="tiny", max_tokens=40, messages=[message]))
    assert served.usage.output_tokens > 0
    with pytest.raises(anthropic.RateLimitError) as limited:
        await in_thread(lambda: claude.messages.create(model="tiny", max_tokens=40, messages=[message]))
    assert int(limited.value.response.headers["retry-after"]) >= 1
    with pytest.raises(openai.RateLimitError) as limited_responses:
        await in_thread(lambda: client.responses.create(model="tiny", input="hi", max_output_tokens=40))
    assert int(limited_responses.value.response.headers["retry-after"]) >= 1


@pytest.mark.slow  # about 3.5 s: openai-agents' import and its asyncio loop in a thread
async def test_openai_agents_default_model_through_the_gateway(gateway: RunningGateway) -> None:
    import agents

    secret, group = await key(gateway, "agent")

    def run() -> Any:
        async def main() -> Any:
            # The default provider, whose default API is Responses (OpenAIResponsesModel).
            agents.set_default_openai_client(
                openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0), use_for_tracing=False
            )
            agent = agents.Agent(
                name="helper",
                instructions="Answer briefly.",
                model="tiny",
                model_settings=agents.ModelSettings(max_tokens=8),
            )
            return await agents.Runner.run(agent, "What is two plus two?")

        agents.set_tracing_disabled(True)
        return asyncio.run(main())

    result = await in_thread(run)
    assert isinstance(result.final_output, str) and result.final_output
    usage = result.context_wrapper.usage
    assert usage.requests == 1 and usage.output_tokens == 8

    async def counted() -> bool:
        return (await gateway.tenancy.service.usage_totals(group_id=group)).completion_tokens == 8

    await wait_until(counted, timeout=10)


async def test_capabilities_learned_from_the_engines(gateway: RunningGateway) -> None:
    # llama-server answers an image to a model without vision with a 500, which was a 502 after
    # a try on each replica, each cooled down. The engines said they have no vision: a 400 here.
    image = [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    refused = await gateway.client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": image}]},
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "unsupported_by_model"
    assert gateway.metric("llmgw_replica_cooldowns_total", {"replica": "a"}) == 0
    assert gateway.metric("llmgw_replica_cooldowns_total", {"replica": "b"}) == 0
    claude = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(anthropic.BadRequestError):
        picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        await in_thread(
            lambda: claude.messages.create(
                model="tiny", max_tokens=2, messages=[{"role": "user", "content": [picture]}]
            )
        )  # type: ignore[list-item]
    listing = (await gateway.client.get("/v1/models")).json()["data"]
    tiny = next(card for card in listing if card["id"] == "tiny")
    # -c 1024 with 4 slots: 256 tokens a request.
    assert tiny["context_length"] == tiny["max_model_len"] == 256
    assert "vision" not in tiny["capabilities"] and "chat" in tiny["capabilities"]
    assert tiny["owned_by"] == "llmgw" and tiny["created"] > 1_600_000_000
    alone = (await gateway.client.get("/v1/models/tiny")).json()
    assert alone == tiny
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    assert (await in_thread(lambda: client.models.retrieve("tiny"))).id == "tiny"


async def test_a_conversation_keeps_its_replica_on_messages_and_responses(gateway: RunningGateway) -> None:
    # Prefix affinity keyed by the system prompt and the opening messages, as for chat.
    system = "You are a careful assistant for conversation number seven."
    bodies = [
        (
            "/v1/messages",
            {
                "model": "tiny",
                "max_tokens": 2,
                "system": system,
                "messages": [{"role": "user", "content": "First question"}],
            },
        ),
        (
            "/v1/messages",
            {
                "model": "tiny",
                "max_tokens": 2,
                "system": system,
                "messages": [
                    {"role": "user", "content": "First question"},
                    {"role": "assistant", "content": "An answer"},
                    {"role": "user", "content": "Second question"},
                ],
            },
        ),
        # llama-server b11312 wants each input item's type (the OpenAI API assumes "message").
        (
            "/v1/responses",
            {
                "model": "tiny",
                "max_output_tokens": 2,
                "instructions": system,
                "input": [{"type": "message", "role": "user", "content": "First question"}],
            },
        ),
        (
            "/v1/responses",
            {
                "model": "tiny",
                "max_output_tokens": 2,
                "instructions": system,
                "input": [
                    {"type": "message", "role": "user", "content": "First question"},
                    {"type": "message", "role": "assistant", "content": "An answer"},
                    {"type": "message", "role": "user", "content": "Second question"},
                ],
            },
        ),
    ]
    for path in ("/v1/messages", "/v1/responses"):
        served = set()
        for route, body in bodies:
            if route == path:
                answer = await gateway.client.post(route, json=body)
                assert answer.status_code == 200, answer.text
                served.add(answer.headers["x-llmgw-replica"])
        assert len(served) == 1
    assert gateway.metric("llmgw_affinity_requests_total", {"model": "tiny", "outcome": "hit"}) >= 4
