"""The dispatch table's APIs at the edge, without an engine: bodies, error shapes, usage, refusals.

Property tests over each API's body shapes (a hostile body is a 400 in that API's shape, never
anything else), over the usage shapes the engines answer in, and over arbitrary engine refusals;
then the gateway with the fake engine for what is the same on every route (keys, x-api-key,
Anthropic's errors, an engine's 501 passed on as a 400 once).
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw_control.api_errors import ClientApiError, sse_error_event
from llmgw_control.catalog.models import ProfileConfig
from llmgw_control.gateway.capabilities import combine, declared, needs, refusal
from llmgw_control.gateway.engine_facts import EngineFacts, facts_from
from llmgw_control.gateway.relay import is_refusal, refusal_answer
from llmgw_control.gateway.requests import ENDPOINTS, parse_request
from llmgw_control.gateway.usage import StreamTail, TokenUsage, find_usage
from llmgw_dev.fake_engine import FakeEngine
from support.gateway import chat_body, endpoint, running_gateway

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
FIELDS = sorted({f.name for e in ENDPOINTS.values() for f in e.fields} | {"content", "role"})


def assert_in_shape(body: bytes, api: str) -> dict[str, Any]:
    value = json.loads(body)
    if api == "anthropic":
        assert value["type"] == "error" and set(value["error"]) == {"type", "message"}
        assert value["error"]["type"] in {
            "invalid_request_error",
            "authentication_error",
            "permission_error",
            "not_found_error",
            "request_too_large",
            "rate_limit_error",
            "api_error",
            "timeout_error",
            "overloaded_error",
        }
    else:
        assert set(value["error"]) == {"message", "type", "param", "code"}
    assert isinstance(value["error"]["message"], str)
    return value  # type: ignore[no-any-return]


@pytest.mark.slow  # a hypothesis run of about two seconds
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(sorted(ENDPOINTS)),
    body=st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6),
    messages=st.lists(
        st.dictionaries(st.sampled_from(["role", "content", "type"]), JSON, max_size=3) | JSON, max_size=3
    ),
)
def test_any_body_is_parsed_or_a_400_in_the_apis_shape(path: str, body: dict[str, Any], messages: Any) -> None:
    endpoint_ = ENDPOINTS[path]
    body["model"] = "m"
    if endpoint_.messages:
        body.setdefault(endpoint_.messages, messages)
    try:
        parsed = parse_request(endpoint_, json.dumps(body).encode())
    except ClientApiError as error:
        assert error.status == 400
        assert_in_shape(error.in_shape(endpoint_.api), endpoint_.api)
        return
    assert parsed.model == "m"
    for spec in endpoint_.fields:
        assert not spec.required or parsed.payload.get(spec.name) is not None


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/messages", {"messages": [{"role": "user", "content": 5}]}),
        ("/v1/messages", {"messages": [{"role": "user", "content": [1, 2]}]}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "tools": [[]]}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "system": 7}),
        ("/v1/messages", {"messages": "hi"}),
        ("/v1/messages", {"messages": []}),
        ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}], "tools": {"a": 1}}),
        ("/v1/responses", {"input": 3}),
        ("/v1/responses", {"input": [1]}),
        ("/v1/responses", {"input": [{"role": "user", "content": {"text": "x"}}]}),
        ("/v1/responses", {"input": "hi", "tools": "all"}),
        ("/v1/responses", {"input": "hi", "max_output_tokens": -1}),
        ("/v1/responses", {"input": "hi", "max_output_tokens": True}),
        ("/v1/rerank", {"query": "q", "documents": "d"}),
        ("/tokenize", {"content": {"x": 1}}),
        ("/detokenize", {"tokens": 1}),
        ("/apply-template", {"messages": [None]}),
        ("/infill", {"input_prefix": ["x"]}),
    ],
)
def test_wrong_types_in_each_api_are_a_400_naming_the_field(path: str, body: dict[str, Any]) -> None:
    endpoint_ = ENDPOINTS[path]
    with pytest.raises(ClientApiError) as caught:
        parse_request(endpoint_, json.dumps({"model": "m", **body}).encode())
    assert caught.value.status == 400 and caught.value.param
    assert_in_shape(caught.value.in_shape(endpoint_.api), endpoint_.api)


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_deep_and_huge_bodies_are_a_400(path: str) -> None:
    deep = b'{"model": "m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(ClientApiError) as caught:
        parse_request(ENDPOINTS[path], deep)
    assert caught.value.status == 400


# -- usage in every API's shape

# Within the absolute cap when summed (an Anthropic prompt is three of them): above it a count is
# clamped, which tests/control/test_usage_bounds.py covers.
counts = st.integers(0, 5 * 10**6)


@given(prompt=counts, completion=counts, cached=counts)
def test_openai_usage(prompt: int, completion: int, cached: int) -> None:
    body = {
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
    }
    assert find_usage(json.dumps(body).encode()) == TokenUsage(prompt, completion, cached if cached <= prompt else 0)


@given(given_=counts, output=counts, cached=counts)
def test_responses_usage_plain_and_streamed(given_: int, output: int, cached: int) -> None:
    usage = {
        "input_tokens": given_,
        "output_tokens": output,
        "total_tokens": given_ + output,
        "input_tokens_details": {"cached_tokens": cached},
    }
    expected = TokenUsage(given_, output, cached if cached <= given_ else 0)
    assert find_usage(json.dumps({"object": "response", "usage": usage}).encode()) == expected
    created = {"type": "response.created", "response": {"usage": None}}
    completed = {"type": "response.completed", "response": {"output": [{"text": "x" * 300}], "usage": usage}}
    stream = (
        f"event: response.created\ndata: {json.dumps(created)}\n\n"
        f"event: response.completed\ndata: {json.dumps(completed)}\n\n"
    ).encode()
    tail = StreamTail()
    tail.feed(stream)
    assert tail.usage() == expected


@given(given_=counts, output=counts, read=counts, created=counts, cut=st.integers(1, 5000), filler=st.integers(0, 3000))
def test_anthropic_usage_plain_and_streamed(
    given_: int, output: int, read: int, created: int, cut: int, filler: int
) -> None:
    usage = {
        "input_tokens": given_,
        "output_tokens": output,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": created,
    }
    expected = TokenUsage(given_ + read + created, output, read)
    assert find_usage(json.dumps({"type": "message", "usage": usage}).encode()) == expected
    # Streamed: the input in message_start, the output in the last message_delta, many deltas
    # between (more than the tail keeps), and chunks cut anywhere.
    start = {"type": "message_start", "message": {"usage": {**usage, "output_tokens": 1}}}
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "word "}}
    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output}}
    stream = (
        f"event: message_start\ndata: {json.dumps(start)}\n\n"
        + f"event: content_block_delta\ndata: {json.dumps(delta)}\n\n" * filler
        + f"event: message_delta\ndata: {json.dumps(end)}\n\n"
        + 'event: message_stop\ndata: {"type": "message_stop"}\n\n'
    ).encode()
    tail = StreamTail(head=True)
    for offset in range(0, len(stream), cut):
        tail.feed(stream[offset : offset + cut])
    assert tail.usage() == expected


@given(st.binary(max_size=300) | JSON.map(lambda v: json.dumps({"usage": v}).encode()))
def test_usage_of_arbitrary_bytes_is_none_or_sane(data: bytes) -> None:
    found = find_usage(data)
    assert found is None or isinstance(found, TokenUsage)
    tail = StreamTail(head=True)
    tail.feed(data)
    assert tail.usage() is None or isinstance(tail.usage(), TokenUsage)


# -- an engine's refusals and the gateway's errors, in every shape


@given(
    status=st.sampled_from([400, 404, 405, 408, 409, 413, 415, 422, 429, 451, 501]),
    body=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()),
    api=st.sampled_from(["openai", "anthropic"]),
)
def test_an_engine_refusal_is_a_4xx_in_the_apis_shape(status: int, body: bytes, api: str) -> None:
    assert is_refusal(status)
    answer, encoded = refusal_answer(status, body, api)
    assert 400 <= answer < 500 and answer == (400 if status == 501 else status)
    assert_in_shape(encoded, api)


@given(
    status=st.sampled_from([400, 401, 403, 404, 405, 413, 429, 500, 502, 503, 504]),
    message=st.text(max_size=50),
    stream_format=st.sampled_from([None, "openai", "anthropic", "responses"]),
)
def test_error_shapes(status: int, message: str, stream_format: str | None) -> None:
    error = ClientApiError(status, message, code="c")
    assert_in_shape(error.in_shape("anthropic"), "anthropic")
    assert_in_shape(error.in_shape("openai"), "openai")
    event = sse_error_event(error, stream_format)
    assert event.endswith(b"\n\n")
    data = json.loads(event.split(b"data: ", 1)[1])
    if stream_format == "anthropic":
        assert event.startswith(b"event: error\n") and data["type"] == "error"
    elif stream_format == "responses":
        assert data["type"] == "error" and data["message"] == message and data["error"]["message"] == message
    else:
        assert data["error"]["message"] == message


def test_engine_5xx_and_key_refusals_are_not_refusals() -> None:
    assert not any(is_refusal(s) for s in (200, 301, 401, 403, 500, 502, 503, 504))


# -- through the gateway, with the fake engine

MESSAGES = {"model": "fake-model", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


async def test_an_engines_501_is_a_400_once_without_cooldown(fake_engine: FakeEngine) -> None:
    # llama-server answers /v1/embeddings on a chat model with 501: the caller's mistake, which
    # was a 502 after three tries, each cooling a replica down.
    fake_engine.behavior.status_before_body = 501
    async with running_gateway(endpoint("e1", fake_engine.url), endpoint("e2", fake_engine.url)) as gw:
        response = await gw.client.post("/v1/embeddings", json={"model": "fake-model", "input": "x"})
        assert response.status_code == 400, response.text
        assert response.headers["x-should-retry"] == "false"
        assert response.json()["error"]["message"]
        assert len(fake_engine.observed.requests) == 1
        assert gw.metric("llmgw_replica_cooldowns_total", {"replica": "e1"}) == 0
        assert gw.metric("llmgw_replica_cooldowns_total", {"replica": "e2"}) == 0
        fake_engine.behavior.status_before_body = None
        ok = await gw.client.post("/v1/chat/completions", json=chat_body())
        assert ok.status_code == 200


async def test_an_engines_4xx_on_messages_comes_in_anthropics_shape(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        # The fake engine has no /v1/messages: its 404 (OpenAI-shaped) is the route's refusal.
        response = await gw.client.post("/v1/messages", json=MESSAGES)
        assert response.status_code == 404 and response.headers["x-should-retry"] == "false"
        assert assert_in_shape(response.content, "anthropic")["error"]["type"] == "not_found_error"
        assert len(fake_engine.observed.requests) == 1


async def test_anthropic_keys_and_errors_at_the_edge(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        service = gw.tenancy.service
        group = await service.create_group("acme")
        created = await service.create_key(name="k", group_id=group.id, models=["fake-model"])
        missing = await gw.client.post("/v1/messages", json=MESSAGES, headers={"anthropic-version": "2023-06-01"})
        assert missing.status_code == 401
        assert assert_in_shape(missing.content, "anthropic")["error"]["type"] == "authentication_error"
        bad = await gw.client.post(
            "/v1/messages", json={**MESSAGES, "messages": "hi"}, headers={"x-api-key": created.secret}
        )
        assert bad.status_code == 400
        assert assert_in_shape(bad.content, "anthropic")["error"]["type"] == "invalid_request_error"
        unknown = await gw.client.post(
            "/v1/messages",
            json={**MESSAGES, "model": "nope"},
            headers={"x-api-key": created.secret, "anthropic-beta": "x"},
        )
        assert unknown.status_code == 404
        assert assert_in_shape(unknown.content, "anthropic")["error"]["type"] == "not_found_error"
        # The anthropic SDK lists models with its x-api-key.
        models = await gw.client.get("/v1/models", headers={"x-api-key": created.secret})
        assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["fake-model"]
        # x-api-key is the Messages convention only; the OpenAI routes keep their Bearer.
        openai_route = await gw.client.post(
            "/v1/responses", json={"model": "fake-model", "input": "x"}, headers={"x-api-key": created.secret}
        )
        assert openai_route.status_code == 401 and assert_in_shape(openai_route.content, "openai")


async def test_every_route_answers_its_405_and_401_in_its_shape(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        await gw.tenancy.service.create_key(name="k", group_id=(await gw.tenancy.service.create_group("g")).id)
        for path, endpoint_ in ENDPOINTS.items():
            wrong = await gw.client.get(path)
            assert wrong.status_code == 405
            assert_in_shape(wrong.content, endpoint_.api)
            unauth = await gw.client.post(path, json={"model": "fake-model"})
            assert unauth.status_code == 401
            assert_in_shape(unauth.content, endpoint_.api)
        assert gw.metric("llmgw_api_requests_total", {"api": "messages", "status": "401"}) == 1


async def test_every_429_says_when_to_come_back(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        service = gw.tenancy.service
        group = await service.create_group("g")
        await service.set_quota(group.id, {"requests_per_minute": 1})
        created = await service.create_key(name="k", group_id=group.id)
        headers = {"x-api-key": created.secret}
        served = await gw.client.post(
            "/v1/chat/completions", json=chat_body(), headers={"authorization": f"Bearer {created.secret}"}
        )
        assert served.status_code == 200
        limited = await gw.client.post("/v1/messages", json=MESSAGES, headers=headers)
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert assert_in_shape(limited.content, "anthropic")["error"]["type"] == "rate_limit_error"


def test_routes_are_one_table() -> None:
    assert {
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/rerank",
        "/rerank",
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/infill",
    } <= set(ENDPOINTS)
    assert ENDPOINTS["/rerank"] is ENDPOINTS["/v1/rerank"]


# -- a Messages or Responses stream whose engine dies midway: refused continuation, tested

BROKEN_STREAMS = {
    "/v1/messages": (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","usage":'
        b'{"input_tokens":9,"output_tokens":0}}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"Hel"}}\n\n'
    ),
    "/v1/responses": (
        b'event: response.created\ndata: {"type":"response.created","response":{"usage":null}}\n\n'
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"delta":"Hel"}\n\n'
    ),
}


async def dying_engine(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """An engine that sends the head of a stream, then drops the connection (no last chunk)."""
    requests: list[bytes] = []

    async def serve(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        while len(body) < length:
            body += await stream.receive_some(65536)
        path = head.split(b" ")[1].decode()
        requests.append(head)
        events = BROKEN_STREAMS[path]
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + f"{len(events):x}\r\n".encode() + events + b"\r\n"
        )
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        task_status.started((listeners[0].socket.getsockname()[1], requests))
        await trio.serve_listeners(serve, listeners, handler_nursery=nursery)


@pytest.mark.parametrize(
    "path, body, shape",
    [
        ("/v1/messages", {**MESSAGES, "stream": True}, "anthropic"),
        ("/v1/responses", {"model": "fake-model", "input": "hi", "stream": True}, "responses"),
    ],
)
async def test_a_broken_messages_or_responses_stream_ends_with_its_error_event(
    path: str,
    body: dict[str, Any],
    shape: str,
    nursery: trio.Nursery,
) -> None:
    port, requests = await nursery.start(dying_engine)
    url = f"http://127.0.0.1:{port}"
    # Two replicas: a chat stream would be continued on the other; these are not.
    async with running_gateway(endpoint("e1", url), endpoint("e2", url)) as gw:
        response = await gw.client.post(path, json=body)
        assert response.status_code == 200
        assert response.content.startswith(BROKEN_STREAMS[path])
        last = response.content[len(BROKEN_STREAMS[path]) :]
        assert last.startswith(b"event: error\ndata: ") and last.endswith(b"\n\n")
        error = json.loads(last.split(b"data: ", 1)[1])
        assert error["type"] == "error"
        if shape == "anthropic":
            assert error["error"]["type"] == "api_error" and "broke off" in error["error"]["message"]
        else:
            assert error["code"] == "upstream_broken" and error["error"]["code"] == "upstream_broken"
        assert len(requests) == 1  # no continuation asked of any replica


# -- capabilities per model

# Trimmed from llama-server b11312's /props and /v1/models on the tiny model (-c 1024 -np 4).
PROPS = {
    "default_generation_settings": {"n_ctx": 256},
    "total_slots": 4,
    "modalities": {"vision": False, "video": False, "audio": False},
    "chat_template_caps": {"supports_tools": False, "supports_tool_calls": False},
    "build_info": "b11312-0c1e57098",
}
MODELS = {
    "object": "list",
    "data": [
        {
            "id": "tiny",
            "object": "model",
            "created": 1796424576,
            "owned_by": "llamacpp",
            "meta": {"n_ctx": 256, "n_ctx_train": 2048},
        }
    ],
}


def test_facts_from_llama_server() -> None:
    assert facts_from(PROPS, MODELS) == EngineFacts(
        vision=False, audio=False, tools=False, context_length=256, created=1796424576
    )
    vllm = {"data": [{"id": "m", "created": 5, "max_model_len": 32768}]}
    assert facts_from(None, vllm) == EngineFacts(context_length=32768, created=5)


@given(props=JSON, models=JSON)
def test_facts_from_anything_never_fail(props: Any, models: Any) -> None:
    facts = facts_from(props, models)
    assert facts.context_length is None or facts.context_length > 0


def request_for(path: str, body: dict[str, Any]) -> Any:
    return parse_request(ENDPOINTS[path], json.dumps({"model": "m", **body}).encode())


IMAGE_CHAT = {
    "messages": [
        {
            "role": "user",
            "content": [{"type": "text", "text": "what"}, {"type": "image_url", "image_url": {"url": "data:,"}}],
        }
    ]
}
IMAGE_MESSAGES = {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]}


def test_what_a_request_needs() -> None:
    assert needs(request_for("/v1/chat/completions", IMAGE_CHAT)) == ["chat", "vision"]
    assert needs(request_for("/v1/messages", IMAGE_MESSAGES)) == ["messages", "vision"]
    assert needs(request_for("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_audio"}]}]})) == [
        "responses",
        "audio",
    ]
    assert needs(request_for("/v1/embeddings", {"input": "x"})) == ["embeddings"]


def test_capabilities_declared_learned_and_overridden() -> None:
    chat = ProfileConfig(name="p")
    embed = ProfileConfig(name="e", args=["--embeddings", "--pooling", "mean"])
    assert declared(chat) == {"chat", "completions", "responses", "messages", "tokenize", "infill"}
    assert declared(embed) is not None and "embeddings" in declared(embed)  # type: ignore[operator]
    assert declared(ProfileConfig(name="v", engine="vllm")) is None
    assert declared(None) is None
    text_only = facts_from(PROPS, MODELS)
    learned = combine(False, declared(chat), [text_only])
    assert learned is not None and learned.context_length == 256 and "vision" not in learned.serves
    assert refusal("m", learned, ["embeddings"]) is not None
    refused = refusal("m", learned, ["chat", "vision"])
    assert refused is not None and refused.status == 400 and "image input" in refused.message
    assert refusal("m", learned, ["chat"]) is None
    # No engine has said: its features are not refused.
    unknown = combine(False, declared(chat), [])
    assert unknown is not None and refusal("m", unknown, ["chat", "vision"]) is None
    # One replica with vision is enough.
    mixed = combine(False, None, [text_only, EngineFacts(vision=True)])
    assert mixed is not None and refusal("m", mixed, ["chat", "vision"]) is None
    # The catalog's list is the operator's word, whatever the engines say.
    override = combine(True, declared(ProfileConfig(name="o", capabilities=["embeddings", "vision"])), [text_only])
    assert override is not None and override.listed() == ["embeddings", "vision"]
    assert refusal("m", override, ["chat"]) is not None and refusal("m", override, ["embeddings"]) is None
    assert combine(False, None, []) is None


def test_a_profile_lists_only_known_capabilities() -> None:
    from llmgw_control.catalog.models import CAPABILITIES

    assert ENDPOINTS["/v1/messages"].capability in CAPABILITIES
    assert {e.capability for e in ENDPOINTS.values()} <= set(CAPABILITIES)


# -- CORS on the client listener


async def test_no_cors_by_default(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        origin = {"origin": "https://app.example"}
        served = await gw.client.post("/v1/chat/completions", json=chat_body(), headers=origin)
        assert served.status_code == 200 and "access-control-allow-origin" not in served.headers
        preflight = await gw.client.options("/v1/messages", headers={**origin, "access-control-request-method": "POST"})
        assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
        plain = await gw.client.options("/v1/chat/completions")
        assert plain.status_code == 204 and "POST" in plain.headers["allow"]


async def test_cors_for_allowed_origins(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url), allowed_origins=["https://app.example"]) as gw:
        allowed = {"origin": "https://app.example"}
        preflight = await gw.client.options(
            "/v1/messages",
            headers={
                **allowed,
                "access-control-request-method": "POST",
                "access-control-request-headers": "x-api-key, anthropic-version, content-type, bad header",
            },
        )
        assert preflight.status_code == 204, preflight.text
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        assert preflight.headers["access-control-allow-headers"] == "x-api-key, anthropic-version, content-type"
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "access-control-allow-credentials" not in preflight.headers
        served = await gw.client.post("/v1/chat/completions", json=chat_body(), headers=allowed)
        assert served.headers["access-control-allow-origin"] == "https://app.example"
        assert served.headers["vary"] == "Origin" and "x-request-id" in served.headers["access-control-expose-headers"]
        # An error must be readable by the page too.
        missing = await gw.client.post("/v1/chat/completions", json={"model": "fake-model"}, headers=allowed)
        assert missing.status_code == 400 and missing.headers["access-control-allow-origin"] == "https://app.example"
        other = {"origin": "https://evil.example"}
        refused = await gw.client.options(
            "/v1/chat/completions", headers={**other, "access-control-request-method": "POST"}
        )
        assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
        stranger = await gw.client.post("/v1/chat/completions", json=chat_body(), headers=other)
        assert "access-control-allow-origin" not in stranger.headers


async def test_cors_for_any_origin_never_allows_credentials(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url), allowed_origins=["*"]) as gw:
        origin = {"origin": "https://anywhere.example"}
        asking = {**origin, "access-control-request-method": "POST"}
        preflight = await gw.client.options("/v1/responses", headers=asking)
        assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == "*"
        served = await gw.client.post("/v1/chat/completions", json=chat_body(), headers=origin)
        assert served.headers["access-control-allow-origin"] == "*"
        for answer in (preflight, served):
            assert "access-control-allow-credentials" not in answer.headers


@pytest.mark.parametrize("origin", ["https://app.example/path", "app.example", "ftp://x", "", "https://a b"])
def test_an_allowed_origin_is_an_origin(origin: str) -> None:
    from llmgw_control.config import ControlConfig, validate
    from llmgw_control.gateway.config import GatewayConfig
    from llmgw_shared.config import ConfigError

    with pytest.raises(ConfigError, match="allowed_origins"):
        validate(ControlConfig(router=GatewayConfig(allowed_origins=[origin])))


async def test_an_engine_refusing_the_gateways_key_is_the_replicas_fault() -> None:
    from llmgw_dev.fake_engine import FakeEngineBehavior, run_fake_engine

    async with run_fake_engine(FakeEngineBehavior(api_key="right")) as engine:
        async with running_gateway(
            endpoint("wrong", engine.url, api_key="stale", weight=100), endpoint("good", engine.url, api_key="right")
        ) as gw:
            # The client's key was fine: it must not get a 401 it would blame on itself.
            response = await gw.client.post("/v1/chat/completions", json=chat_body())
            assert response.status_code == 200 and response.headers["x-llmgw-replica"] == "good"
            assert gw.metric("llmgw_replica_cooldowns_total", {"replica": "wrong"}) == 1


async def silent_engine(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Accepts connections and never answers."""

    async def serve(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(serve, listeners, handler_nursery=nursery)


@pytest.mark.slow  # waits out one probe deadline (2 s)
async def test_models_listing_waits_at_most_one_probe_for_dead_or_hung_engines(
    fake_engine: FakeEngine,
    nursery: trio.Nursery,
) -> None:
    from llmgw_dev.engine_proc import free_port

    hung = f"http://127.0.0.1:{await nursery.start(silent_engine)}"
    dead = f"http://127.0.0.1:{free_port()}"
    async with running_gateway(
        endpoint("hung", hung, "hung-model"),
        endpoint("dead", dead, "dead-model"),
        endpoint("fake", fake_engine.url, "fake-model"),
    ) as gw:
        started = trio.current_time()
        listing = await gw.client.get("/v1/models")
        assert listing.status_code == 200 and trio.current_time() - started < 4
        cards = {card["id"]: card for card in listing.json()["data"]}
        assert set(cards) == {"hung-model", "dead-model", "fake-model"}
        assert "capabilities" not in cards["hung-model"] and "capabilities" not in cards["dead-model"]
        # The fake engine has no /props but answered: known, with nothing refused.
        assert "chat" in cards["fake-model"]["capabilities"] and "vision" in cards["fake-model"]["capabilities"]
        assert all(card["created"] > 0 and card["owned_by"] == "llmgw" for card in cards.values())
        # Not asked again within the retry interval: the next listing does not wait.
        started = trio.current_time()
        assert (await gw.client.get("/v1/models/hung-model")).status_code == 200
        assert trio.current_time() - started < 1


async def test_a_catalog_profile_refuses_what_it_cannot_serve_before_any_replica_starts() -> None:
    # No replica runs and none is asked to start: the activator would hold each of these requests
    # until one did, and then the engine would refuse it.
    from prometheus_client import CollectorRegistry

    from llmgw_control.catalog.models import Catalog, EngineConfig, ModelConfig
    from llmgw_control.gateway.config import GatewayConfig
    from llmgw_control.gateway.directory import FleetDirectory
    from llmgw_control.gateway.gateway import Gateway
    from llmgw_control.gateway.metrics import GatewayMetrics
    from llmgw_control.gateway.replicas import ReplicaSet
    from llmgw_control.gateway.upstream import Httpx2Upstream

    catalog = Catalog(
        [
            ModelConfig("chat", [ProfileConfig(name="cpu")]),
            ModelConfig("embed", [ProfileConfig(name="cpu", args=["--embeddings"])]),
            ModelConfig("only", [ProfileConfig(name="cpu", capabilities=["embeddings"])]),
        ],
        [EngineConfig(name="llama.cpp", version="b11312")],
    )
    replicas = ReplicaSet()
    gateway = Gateway(
        replicas,
        Httpx2Upstream(),
        GatewayMetrics(CollectorRegistry()),
        GatewayConfig(),
        directory=FleetDirectory(catalog, replicas),
    )
    transport = httpx2.ASGITransport(app=gateway)  # type: ignore[arg-type]
    async with httpx2.AsyncClient(transport=transport, base_url="http://gw") as client:
        for model, path, body in (
            ("chat", "/v1/embeddings", {"input": "x"}),
            ("chat", "/v1/rerank", {"query": "q", "documents": ["d"]}),
            ("only", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
            ("only", "/v1/messages", {"messages": [{"role": "user", "content": "x"}]}),
        ):
            with trio.fail_after(5):
                refused = await client.post(path, json={"model": model, **body})
            assert refused.status_code == 400, (model, path, refused.text)
            assert refused.headers["x-should-retry"] == "false"
            shape = assert_in_shape(refused.content, ENDPOINTS[path].api)
            assert "does not serve" in shape["error"]["message"]
        cards = {c["id"]: c for c in (await client.get("/v1/models")).json()["data"]}
    assert "embeddings" in cards["embed"]["capabilities"] and "embeddings" not in cards["chat"]["capabilities"]
    assert cards["only"]["capabilities"] == ["embeddings"] and cards["chat"]["context_length"] == 4096
