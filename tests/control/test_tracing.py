"""OpenTelemetry traces of client requests, exported by the SDK's OTLP exporters to real receivers
on loopback (tests/support/otlp.py): the spans and their attributes, the client's traceparent and
the engine's, retries, sampling, secrets kept out, and a collector that is down or stuck."""

from __future__ import annotations

import re
import time

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_dev.engine_proc import free_port
from llmgw_dev.fake_engine import FakeEngine, FakeEngineBehavior, run_fake_engine
from llmgw_shared import tracing as shared_tracing
from llmgw_shared.tracing import TracingConfig
from support.gateway import chat_body, endpoint, running_gateway
from support.otlp import GrpcReceiver, Received, grpc_receiver, http_receiver

SERVER, CLIENT = 2, 3  # OTLP's SpanKind numbers


@pytest.fixture(autouse=True)
def export_often(monkeypatch: pytest.MonkeyPatch) -> None:
    # Spans reach the receiver within 50 ms rather than the daemon's second.
    monkeypatch.setattr(shared_tracing, "_EXPORT_EVERY", 0.05)


def tracing(url: str, **fields: object) -> TracingConfig:
    return TracingConfig(endpoint=url, **fields)  # type: ignore[arg-type]


def one_request(spans: list[Received]) -> bool:
    names = {s.name for s in spans}
    return "llmgw.request" in names and "llmgw.attempt" in names


def attributes_of(spans: list[Received]) -> list[str]:
    out = []
    for span in spans:
        out.extend(str(v) for v in span.attributes.values())
        for _, attributes in span.events:
            out.extend(str(v) for v in attributes.values())
    return out


async def test_a_request_is_a_server_span_with_an_attempt_and_the_engine_gets_its_context(
    fake_engine: FakeEngine,
) -> None:
    fake_engine.behavior.prompt_tokens = 11
    fake_engine.behavior.chunks = 5
    async with (
        http_receiver() as receiver,
        running_gateway(endpoint("e1", fake_engine.url), tracing=tracing(receiver.url)) as gw,
    ):
        response = await gw.client.post("/v1/chat/completions", json=chat_body())
        assert response.status_code == 200
        spans = await receiver.wait_for(one_request)
    (request,) = [s for s in spans if s.name == "llmgw.request"]
    (attempt,) = [s for s in spans if s.name == "llmgw.attempt"]
    assert request.kind == SERVER and attempt.kind == CLIENT
    assert request.service == "llmgw-control"
    assert request.parent_span_id == ""
    assert request.attributes["gen_ai.request.model"] == "fake-model"
    assert request.attributes["gen_ai.operation.name"] == "chat"
    assert request.attributes["llmgw.profile"] == "fake-model"
    assert request.attributes["llmgw.replica"] == "e1"
    assert request.attributes["llmgw.api"] == "openai"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["gen_ai.usage.input_tokens"] == 11
    assert request.attributes["gen_ai.usage.output_tokens"] == 5
    assert [name for name, _ in request.events] == ["llmgw.replica_chosen"]
    assert attempt.trace_id == request.trace_id and attempt.parent_span_id == request.span_id
    assert attempt.attributes["llmgw.outcome"] == "answered"
    assert attempt.attributes["llmgw.replica"] == "e1"
    # The engine's request names the attempt as its parent, in the same trace.
    traceparent = fake_engine.observed.requests[-1].headers["traceparent"]
    version, trace_id, parent, flags = traceparent.split("-")
    assert (version, trace_id, parent) == ("00", attempt.trace_id, attempt.span_id)
    assert int(flags, 16) & 1  # sampled (the SDK sets W3C's random-trace-id flag too)


async def test_a_collector_named_by_its_base_url_gets_the_traces_on_the_signal_path(fake_engine: FakeEngine) -> None:
    # OTEL_EXPORTER_OTLP_ENDPOINT's form (http://collector:4318): the SDK appends /v1/traces to it,
    # and so does [tracing]; the receiver answers 404 elsewhere, as the Collector does.
    async with http_receiver() as receiver:
        base = receiver.url.removesuffix("/v1/traces")
        async with running_gateway(endpoint("e1", fake_engine.url), tracing=tracing(base)) as gw:
            assert (await gw.client.post("/v1/chat/completions", json=chat_body())).status_code == 200
            await receiver.wait_for(one_request)


def test_an_endpoint_with_a_path_is_kept_and_a_base_url_gets_the_signal_path() -> None:
    assert shared_tracing.http_traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert shared_tracing.http_traces_url("https://c:4318/") == "https://c:4318/v1/traces"
    assert shared_tracing.http_traces_url("http://c/otlp/v1/traces") == "http://c/otlp/v1/traces"


async def test_a_client_traceparent_makes_the_request_its_child(fake_engine: FakeEngine) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with (
        http_receiver() as receiver,
        running_gateway(endpoint("e1", fake_engine.url), tracing=tracing(receiver.url, sample_ratio=0.0)) as gw,
    ):
        # Sampled by its caller: recorded even at a ratio of 0 for new traces (parent-based).
        response = await gw.client.post(
            "/v1/chat/completions", json=chat_body(), headers={"traceparent": f"00-{trace_id}-{parent}-01"}
        )
        assert response.status_code == 200
        spans = await receiver.wait_for(one_request)
    (request,) = [s for s in spans if s.name == "llmgw.request"]
    assert request.trace_id == trace_id and request.parent_span_id == parent
    assert fake_engine.observed.requests[-1].headers["traceparent"].startswith(f"00-{trace_id}-")


async def test_a_malformed_traceparent_starts_a_new_trace(fake_engine: FakeEngine) -> None:
    async with (
        http_receiver() as receiver,
        running_gateway(endpoint("e1", fake_engine.url), tracing=tracing(receiver.url)) as gw,
    ):
        for bad in ("00-zz-yy-01", "x" * 5000, "00-" + "0" * 32 + "-" + "1" * 16 + "-01"):
            response = await gw.client.post("/v1/chat/completions", json=chat_body(), headers={"traceparent": bad})
            assert response.status_code == 200
        spans = await receiver.wait_for(lambda s: len([x for x in s if x.name == "llmgw.request"]) == 3)
    assert all(s.parent_span_id == "" for s in spans if s.name == "llmgw.request")


async def test_a_failed_first_replica_gives_two_attempts_with_their_outcomes(fake_engine: FakeEngine) -> None:
    # The dead replica weighs ten times more: least-loaded picks it first, every time.
    dead = endpoint("dead", f"http://127.0.0.1:{free_port()}", weight=10.0)
    async with (
        http_receiver() as receiver,
        running_gateway(dead, endpoint("e1", fake_engine.url), tracing=tracing(receiver.url)) as gw,
    ):
        response = await gw.client.post("/v1/chat/completions", json=chat_body())
        assert response.status_code == 200
        spans = await receiver.wait_for(lambda s: len([x for x in s if x.name == "llmgw.attempt"]) == 2)
    attempts = sorted((s for s in spans if s.name == "llmgw.attempt"), key=lambda s: s.attributes["llmgw.attempt"])
    assert [(a.attributes["llmgw.replica"], a.attributes["llmgw.outcome"]) for a in attempts] == [
        ("dead", "retry"),
        ("e1", "answered"),
    ]
    assert attempts[0].attributes["llmgw.reason"] == "connect"
    assert attempts[0].status_code == 2  # STATUS_CODE_ERROR
    (request,) = [s for s in spans if s.name == "llmgw.request"]
    assert request.attributes["llmgw.replica"] == "e1"


async def test_a_sample_ratio_of_zero_exports_nothing(fake_engine: FakeEngine) -> None:
    async with http_receiver() as receiver:
        async with running_gateway(
            endpoint("e1", fake_engine.url), tracing=tracing(receiver.url, sample_ratio=0.0)
        ) as gw:
            for _ in range(5):
                assert (await gw.client.post("/v1/chat/completions", json=chat_body())).status_code == 200
        # The gateway has stopped: its last flush is done.
        assert receiver.spans == [] and receiver.requests == 0
    # Not sampled, still propagated (as the SDK's propagator writes an unsampled span's context):
    # a new trace id with the sampled bit clear (02: only W3C's random-trace-id flag).
    traceparents = [r.headers["traceparent"] for r in fake_engine.observed.requests[-5:]]
    assert all(_TRACEPARENT.fullmatch(t) and int(t[-2:], 16) & 1 == 0 for t in traceparents)
    assert len({t.split("-")[1] for t in traceparents}) == 5


async def test_a_client_traceparent_not_sampled_is_forwarded_as_the_same_trace_not_sampled(
    fake_engine: FakeEngine,
) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with http_receiver() as receiver:
        async with running_gateway(endpoint("e1", fake_engine.url), tracing=tracing(receiver.url)) as gw:
            response = await gw.client.post(
                "/v1/chat/completions",
                json=chat_body(),
                headers={"traceparent": f"00-{trace_id}-{parent}-00", "tracestate": "vendor=abc,other@sys=x y"},
            )
            assert response.status_code == 200
        # The caller decided not to sample: the gateway follows it (parent-based), records nothing.
        assert receiver.spans == []
    headers = fake_engine.observed.requests[-1].headers
    version, forwarded_trace, forwarded_parent, flags = headers["traceparent"].split("-")
    assert (version, forwarded_trace, flags) == ("00", trace_id, "00")
    assert forwarded_parent != "0" * 16
    assert headers["tracestate"] == "vendor=abc,other@sys=x y"


async def test_a_client_tracestate_rides_along_with_a_sampled_request(fake_engine: FakeEngine) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with (
        http_receiver() as receiver,
        running_gateway(endpoint("e1", fake_engine.url), tracing=tracing(receiver.url)) as gw,
    ):
        response = await gw.client.post(
            "/v1/chat/completions",
            json=chat_body(),
            headers={"traceparent": f"00-{trace_id}-{parent}-01", "tracestate": "congo=t61rcWkgMzE"},
        )
        assert response.status_code == 200
        await receiver.wait_for(one_request)
    assert fake_engine.observed.requests[-1].headers["tracestate"] == "congo=t61rcWkgMzE"


_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_MEMBER = st.builds(
    "{}={}".format,
    st.from_regex(r"[a-z][a-z0-9_\-*/]{0,20}", fullmatch=True),
    st.from_regex(r"[!-+\--<>-~]{1,20}", fullmatch=True),
)


def _trimmed(value: str | None) -> str | None:
    return (value or "").strip(" ") or None


def _header_examples() -> list[tuple[str | None, str | None]]:
    """traceparent and tracestate pairs from hypothesis: well formed, near misses and hostile."""
    found: list[tuple[str | None, str | None]] = []
    hexes = st.text("0123456789abcdef", min_size=1, max_size=40)
    ascii_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=600)
    traceparent = st.one_of(
        st.none(),
        ascii_text,
        st.builds("00-{}-{}-{}".format, hexes, hexes, st.sampled_from(["00", "01", "02", "03", "ff", "zz"])),
        st.builds(
            "00-{}-{}-0{}".format,
            st.text("0123456789abcdef", min_size=32, max_size=32),
            st.text("0123456789abcdef", min_size=16, max_size=16),
            st.sampled_from("0123"),
        ),
    )
    tracestate = st.one_of(
        st.none(),
        ascii_text,
        st.lists(_MEMBER, min_size=1, max_size=40).map(",".join),
        st.builds("{}{}".format, st.lists(_MEMBER, min_size=1, max_size=3).map(",".join), ascii_text),
        st.just("a=" + "b" * 4000),
        st.just("k=v," * 200),
    )

    @settings(max_examples=60, database=None, deadline=None)
    @given(traceparent=traceparent, tracestate=tracestate)
    def collect(traceparent: str | None, tracestate: str | None) -> None:
        # What an HTTP client can send at all: no leading or trailing blanks in a header value.
        found.append((_trimmed(traceparent), _trimmed(tracestate)))

    collect()
    return found


async def test_hostile_trace_headers_never_fail_a_request_and_only_valid_context_is_forwarded(
    fake_engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    examples = _header_examples()
    async with (
        http_receiver() as receiver,
        running_gateway(endpoint("e1", fake_engine.url), tracing=tracing(receiver.url, sample_ratio=0.5)) as gw,
    ):
        for traceparent, tracestate in examples:
            headers = {k: v for k, v in (("traceparent", traceparent), ("tracestate", tracestate)) if v is not None}
            response = await gw.client.post("/v1/chat/completions", json=chat_body(), headers=headers)
            assert response.status_code == 200, (traceparent, tracestate)
            sent = fake_engine.observed.requests[-1].headers
            # Always a well-formed context; the client's trace id when its traceparent was one.
            match = _TRACEPARENT.fullmatch(sent["traceparent"])
            assert match is not None
            client = _TRACEPARENT.fullmatch(traceparent or "")
            if client and client[1] != "0" * 32 and client[2] != "0" * 16 and client[3] != "ff":
                assert match[1] == client[1]
                assert int(match[3], 16) & 1 == int(client[3], 16) & 1  # sampled as its caller said
                # A tracestate is the client's own, within W3C's bounds, or none at all.
                if "tracestate" in sent:
                    assert sent["tracestate"] == tracestate and len(sent["tracestate"]) <= 512
            else:
                assert "tracestate" not in sent
    # The SDK's parser never saw (and so never logged) a malformed tracestate.
    assert "tracestate" not in caplog.text and "Member doesn't match" not in caplog.text


async def test_grpc_export(fake_engine: FakeEngine) -> None:
    receiver: GrpcReceiver
    with grpc_receiver() as receiver:
        config = tracing(receiver.url, protocol="grpc", headers={"x-collector-key": "grpc-secret"})
        async with running_gateway(endpoint("e1", fake_engine.url), tracing=config) as gw:
            assert (
                await gw.client.post("/v1/embeddings", json={"model": "fake-model", "input": "hi"})
            ).status_code == 200
            spans = await receiver.wait_for(one_request)
    (request,) = [s for s in spans if s.name == "llmgw.request"]
    assert request.attributes["gen_ai.operation.name"] == "embeddings"
    assert receiver.headers[-1]["x-collector-key"] == "grpc-secret"


def _examples() -> list[tuple[str, str]]:
    """Prompts and client keys from hypothesis, sent below through one running gateway."""
    found: list[tuple[str, str]] = []
    text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=12, max_size=200)
    key = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=16, max_size=64)

    @settings(max_examples=25, database=None, deadline=None)
    @given(prompt=text.filter(lambda t: t.strip()), key=key)
    def collect(prompt: str, key: str) -> None:
        found.append((prompt, "sk-" + key))

    collect()
    return found


async def test_no_prompt_or_key_is_in_any_span(fake_engine: FakeEngine, caplog: pytest.LogCaptureFixture) -> None:
    examples = _examples()
    engine_key = "engine-key-0123456789abcdef"
    async with run_fake_engine(FakeEngineBehavior(api_key=engine_key)) as engine, http_receiver() as receiver:
        config = tracing(receiver.url, headers={"authorization": "Bearer collector-secret-42"})
        async with running_gateway(endpoint("e1", engine.url, api_key=engine_key), tracing=config) as gw:
            for prompt, key in examples:
                for path, body in (
                    ("/v1/chat/completions", chat_body(messages=[{"role": "user", "content": prompt}])),
                    ("/v1/completions", {"model": "fake-model", "prompt": prompt}),
                    ("/v1/embeddings", {"model": "fake-model", "input": prompt}),
                ):
                    response = await gw.client.post(
                        path, json=body, headers={"authorization": f"Bearer {key}", "x-api-key": key}
                    )
                    assert response.status_code == 200
            spans = await receiver.wait_for(
                lambda s: len([x for x in s if x.name == "llmgw.request"]) == 3 * len(examples)
            )
    values = attributes_of(spans)
    for prompt, key in examples:
        assert not any(prompt in v or key in v for v in values)
    assert not any(engine_key in v or "collector-secret-42" in v for v in values)
    assert receiver.headers[-1]["authorization"] == "Bearer collector-secret-42"
    assert "collector-secret-42" not in caplog.text


async def test_capture_prompts_puts_the_prompt_in_the_span(fake_engine: FakeEngine) -> None:
    async with (
        http_receiver() as receiver,
        running_gateway(endpoint("e1", fake_engine.url), tracing=tracing(receiver.url, capture_prompts=True)) as gw,
    ):
        body = chat_body(messages=[{"role": "user", "content": "the secret recipe"}])
        assert (await gw.client.post("/v1/chat/completions", json=body)).status_code == 200
        spans = await receiver.wait_for(one_request)
    (request,) = [s for s in spans if s.name == "llmgw.request"]
    assert "the secret recipe" in request.attributes["gen_ai.prompt"]


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["unreachable", "hanging"])
async def test_a_dead_or_stuck_collector_slows_no_request_and_shutdown_stays_bounded(
    fake_engine: FakeEngine, collector: str
) -> None:
    async with http_receiver() as receiver:
        receiver.hang = collector == "hanging"
        url = receiver.url if receiver.hang else f"http://127.0.0.1:{free_port()}/v1/traces"
        config = tracing(url, export_timeout=2.0, queue_size=8)
        async with running_gateway(endpoint("e1", fake_engine.url), tracing=config) as gw:
            started = time.monotonic()
            # Across several export attempts (one a second), each of which fails or hangs.
            while time.monotonic() - started < 3:
                with trio.fail_after(2):
                    response = await gw.client.post("/v1/chat/completions", json=chat_body())
                assert response.status_code == 200
            # The queue (8 spans) filled while exports failed: the rest were dropped and counted.
            assert gw.metric("llmgw_trace_spans_dropped_total") > 0
            stopping = time.monotonic()
        # Cancelled with its export stuck: the last flush and the exporter's close are bounded.
        assert time.monotonic() - stopping < 5
