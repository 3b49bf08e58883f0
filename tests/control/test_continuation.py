"""Streams that survive their replica: the splicing as a property, and the gateway against fake engines."""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.gateway.continuation import StreamRecord, continuation_request, ending
from llmgw_control.gateway.requests import ENDPOINTS, parse_request
from llmgw_dev.fake_engine import FakeEngineBehavior, run_fake_engine
from support.gateway import chat_body, endpoint, running_gateway
from support.waiting import wait_until

PROMPT_TOKENS = 9


def sse(text: str) -> list[Any]:
    found = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                found.append(data if data == "[DONE]" else json.loads(data))
    return found


def _head(kind: str, rid: str) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": 1000 if rid == "a" else 2000,
        "model": f"served-{rid}",
    }


def engine_stream(
    kind: str,
    rid: str,
    tokens: list[str],
    *,
    echo: str = "",
    separate_echo: bool = False,
    prompt: int = PROMPT_TOKENS,
    usage_chunk: bool = True,
) -> bytes:
    """A llama-server-shaped stream of ``tokens``; a continuation's echo leads its first delta."""
    events: list[dict[str, Any]] = []
    head = _head(kind, rid)
    if kind == "chat":
        events.append(
            {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]}
        )
    pieces = list(tokens)
    if echo and separate_echo:
        pieces.insert(0, echo)
    elif echo:
        pieces = [echo + pieces[0], *pieces[1:]] if pieces else [echo]
    for piece in pieces:
        choice = {"index": 0, "delta": {"content": piece}} if kind == "chat" else {"index": 0, "text": piece}
        events.append({**head, "choices": [{**choice, "finish_reason": None}]})
    usage = {"prompt_tokens": prompt, "completion_tokens": len(tokens), "total_tokens": prompt + len(tokens)}
    if kind == "chat":
        events.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if usage_chunk:
            events.append({**head, "choices": [], "usage": usage})
    else:
        events.append({**head, "choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _pieces(data: bytes, splits: list[int]) -> list[bytes]:
    """``data`` in arbitrary pieces (as the network hands it over)."""
    cuts = sorted({s % (len(data) + 1) for s in splits})
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["chat", "completions"]),
    tokens=st.lists(st.text(alphabet='ab é😀\n{}"', min_size=1, max_size=4), min_size=1, max_size=12),
    cut=st.integers(min_value=0),
    splits=st.lists(st.integers(min_value=0), max_size=6),
    wants_usage=st.booleans(),
    separate_echo=st.booleans(),
    spare=st.sampled_from([0, 3]),
)
def test_a_stream_cut_anywhere_and_continued_reads_as_one_stream(
    kind: str,
    tokens: list[str],
    cut: int,
    splits: list[int],
    wants_usage: bool,
    separate_echo: bool,
    spare: int,
) -> None:
    body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": len(tokens) + spare}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "Once"
    if wants_usage:
        body["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    request = parse_request(ENDPOINTS[path], json.dumps(body).encode())
    record = StreamRecord(request)
    first = engine_stream(kind, "a", tokens)
    first = first[: cut % len(first)]  # the engine dies somewhere before its [DONE]
    client = b"".join(record.whole_events(piece) for piece in _pieces(first, splits))
    seen = record.seen()
    assert not seen.other
    assert seen.tokens <= len(tokens) and seen.text == "".join(tokens[: seen.tokens])
    end = ending(request, seen)
    if end is not None:
        # The whole answer had arrived but for its last events: the gateway sends those.
        events = sse((client + end).decode())
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        assert _text(events) == "".join(tokens)
        assert [c["finish_reason"] for e in events[:-1] for c in e["choices"] if c["finish_reason"]] == ["length"]
        return
    plan = continuation_request(request, seen)
    assert plan is not None
    assert plan.payload["max_tokens"] == len(tokens) + spare - seen.tokens
    if not seen.text:
        field = "messages" if kind == "chat" else "prompt"
        assert plan.payload[field] == body[field]
    elif kind == "chat":
        assert plan.payload["messages"][-1] == {"role": "assistant", "content": seen.text}
    else:
        assert plan.payload["prompt"] == "Once" + seen.text
    record.continue_after(seen)
    splice = record.splice
    assert splice is not None
    # The continuation reads the client's prompt plus what it had received, and echoes the prefill.
    second = engine_stream(
        kind,
        "b",
        tokens[seen.tokens :],
        echo=seen.text if kind == "chat" else "",
        separate_echo=separate_echo,
        prompt=PROMPT_TOKENS + seen.tokens,
    )
    for piece in _pieces(second, splits):
        client += record.whole_events(splice.feed(piece))
    client += record.whole_events(splice.rest()) + record.rest()

    events = sse(client.decode())  # every event whole: json.loads would fail on half of one
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [e for e in events if e != "[DONE]"]
    expected = ("a", 1000, "served-a") if seen.id is not None else ("b", 2000, "served-b")
    assert {(e["id"], e["created"], e["model"]) for e in chunks} == {expected}
    if kind == "chat":
        roles = [c for e in chunks for c in e["choices"] if "role" in c["delta"]]
        assert len(roles) == 1
        text = "".join(c["delta"].get("content") or "" for e in chunks for c in e["choices"])
    else:
        text = "".join(c["text"] for e in chunks for c in e["choices"])
    assert text == "".join(tokens)
    finishes = [c["finish_reason"] for e in chunks for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    usages = [e["usage"] for e in chunks if "usage" in e]
    if wants_usage or kind == "completions":
        assert usages == [
            {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": len(tokens),
                "total_tokens": PROMPT_TOKENS + len(tokens),
            }
        ]
    else:
        assert usages == []
    # Charged: both attempts read the prompt (the second with what had been generated), and each
    # token was generated once.
    assert splice.charged is not None
    assert splice.charged.prompt_tokens == 2 * PROMPT_TOKENS + seen.tokens
    assert splice.charged.completion_tokens == len(tokens)


# -- the gateway, against fake engines ------------------------------------------------------------

FULL = "".join(f"tok{i} " for i in range(8))


def _text(events: list[Any]) -> str:
    return "".join(
        (c.get("delta") or {}).get("content") or c.get("text") or ""
        for e in events
        if isinstance(e, dict)
        for c in e.get("choices") or ()
    )


async def test_a_chat_stream_whose_engine_dies_is_continued_on_the_other_replica(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.access")
    behavior = FakeEngineBehavior(close_mid_stream_after=3, stream_fault_times=1)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url)) as gw:
            response = await gw.client.post(
                "/v1/chat/completions",
                json=chat_body(stream=True, max_tokens=20, stream_options={"include_usage": True}),
            )
            assert response.status_code == 200
            events = sse(response.text)
            assert events[-1] == "[DONE]"
            assert not any("error" in e for e in events if isinstance(e, dict))
            assert _text(events) == FULL
            chunks = [e for e in events if e != "[DONE]"]
            assert len({e["id"] for e in chunks}) == 1 and len({e["created"] for e in chunks}) == 1
            assert sum("role" in c["delta"] for e in chunks for c in e["choices"]) == 1
            assert chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 8, "total_tokens": 15}
            requests = [r.json for r in a.observed.requests + b.observed.requests]
            assert len(requests) == 2
            continued = next(r for r in requests if r["messages"][-1]["role"] == "assistant")
            assert continued["messages"][-1]["content"] == "tok0 tok1 tok2 "
            assert continued["max_tokens"] == 17
            labels = {"model": "fake-model", "outcome": "continued"}
            assert await gw.settled_metric("llmgw_stream_continuations_total", labels, expect=1) == 1
            # Quotas and metrics count what the engines did: two prompts (the second with the
            # three tokens it was given), eight tokens generated.
            prompt = {"model": "fake-model", "kind": "prompt"}
            assert await gw.settled_metric("llmgw_tokens_total", prompt, expect=7 + 10) == 17
            assert gw.metric("llmgw_tokens_total", {"model": "fake-model", "kind": "completion"}) == 8
    served = [r for r in caplog.records if r.name == "llmgw.access" and r.getMessage() == "served"]
    assert [getattr(r, "continuations", None) for r in served] == [1]
    assert getattr(served[0], "status", None) == 200


async def test_a_stream_whose_engine_stalls_past_the_idle_timeout_is_continued() -> None:
    behavior = FakeEngineBehavior(hang_mid_stream_after=4, stream_fault_times=1)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url), idle_timeout=0.3) as gw:
            response = await gw.client.post(
                "/v1/completions", json={"model": "fake-model", "prompt": "Once", "stream": True, "max_tokens": 8}
            )
            events = sse(response.text)
            assert events[-1] == "[DONE]" and _text(events) == FULL
            requests = [r.json for r in a.observed.requests + b.observed.requests]
            assert len(requests) == 2
            continued = next(r for r in requests if r["prompt"] != "Once")
            assert continued["prompt"] == "Once" + "tok0 tok1 tok2 tok3 " and continued["max_tokens"] == 4
            # The stalled engine's request was closed, so it stops generating.
            await wait_until(lambda: a.observed.disconnects + b.observed.disconnects, timeout=5, interval=0.01)


async def test_streams_cut_at_any_byte_are_continued_whole() -> None:
    behavior = FakeEngineBehavior()
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url)) as gw:
            for kind, path, body in (
                ("chat", "/v1/chat/completions", chat_body(stream=True)),
                ("completions", "/v1/completions", {"model": "fake-model", "prompt": "Once", "stream": True}),
            ):
                behavior.stream_fault_times = None
                behavior.cut_after_bytes = None
                whole = (await gw.client.post(path, json=body)).text
                # Every byte boundary of the first few events and a spread over the rest.
                for cut in [*range(1, 400, 7), *range(400, len(whole) - 1, 97)]:
                    behavior.cut_after_bytes, behavior.stream_fault_times = cut, 1
                    response = await gw.client.post(path, json=body)
                    events = sse(response.text)
                    assert events[-1] == "[DONE]", (kind, cut, response.text[-300:])
                    assert _text(events) == FULL, (kind, cut)


async def test_a_continuation_answered_with_a_4xx_is_not_retried() -> None:
    dying = FakeEngineBehavior(close_mid_stream_after=2)
    refusing = FakeEngineBehavior(status_before_body=400)
    async with run_fake_engine(dying) as a, run_fake_engine(refusing) as b, run_fake_engine(refusing) as c:
        async with running_gateway(endpoint("a", a.url, weight=1000), endpoint("b", b.url), endpoint("c", c.url)) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat_body(stream=True))
            events = sse(response.text)
            assert "[DONE]" not in events and events[-1]["error"]["code"] == "upstream_error"
            assert len(b.observed.requests) + len(c.observed.requests) == 1
            labels = {"model": "fake-model", "outcome": "refused"}
            assert await gw.settled_metric("llmgw_stream_continuations_total", labels, expect=1) == 1


async def test_a_request_refused_with_a_4xx_is_neither_retried_nor_continued() -> None:
    refusing = FakeEngineBehavior(status_before_body=400)
    async with run_fake_engine(refusing) as a, run_fake_engine(refusing) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url)) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat_body(stream=True))
            assert response.status_code == 400
            assert len(a.observed.requests) + len(b.observed.requests) == 1


async def test_continuations_stop_after_max_continuations_with_the_error_event() -> None:
    behavior = FakeEngineBehavior(close_mid_stream_after=2)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b, run_fake_engine(behavior) as c:
        async with running_gateway(
            endpoint("a", a.url), endpoint("b", b.url), endpoint("c", c.url), max_continuations=1
        ) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat_body(stream=True))
            events = sse(response.text)
            assert "[DONE]" not in events and events[-1]["error"]["code"] == "upstream_broken"
            # What reached the client was never repeated: two attempts, two tokens each.
            assert _text(events) == "tok0 tok1 tok2 tok3 "
            assert sum(len(e.observed.requests) for e in (a, b, c)) == 2
            labels = {"model": "fake-model", "outcome": "gave_up"}
            assert await gw.settled_metric("llmgw_stream_continuations_total", labels, expect=1) == 1


async def test_a_stream_of_a_model_that_opts_out_or_with_continuations_off_ends_with_an_error_event() -> None:
    behavior = FakeEngineBehavior(close_mid_stream_after=2)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        for router in ({"max_continuations": 0}, {"continue_streams": {"fake-model": False}}):
            async with running_gateway(endpoint("a", a.url), endpoint("b", b.url), **router) as gw:
                response = await gw.client.post("/v1/chat/completions", json=chat_body(stream=True))
                events = sse(response.text)
                assert "[DONE]" not in events and events[-1]["error"]["code"] == "upstream_broken"
        assert len(a.observed.requests) + len(b.observed.requests) == 2


async def test_a_client_that_hangs_up_is_not_continued_for() -> None:
    # The engine stalls after two tokens; the client reads them and hangs up, and the gateway's
    # own close of the engine's stream is no break to continue.
    behavior = FakeEngineBehavior(hang_mid_stream_after=2)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url)) as gw:
            async with httpx2.AsyncClient(base_url=gw.url) as client:
                async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as response:
                    received = ""
                    async for text in response.aiter_text():
                        received += text
                        if _text(sse(received.rpartition("\n\n")[0])) == "tok0 tok1 ":
                            break
            await wait_until(lambda: a.observed.disconnects + b.observed.disconnects, timeout=5, interval=0.01)
            gone = {"model": "fake-model", "status": "499"}
            await wait_until(
                lambda: sum(gw.metric("llmgw_requests_total", {**gone, "replica": r}) for r in "ab") >= 1,
                timeout=5,
                interval=0.01,
            )
            assert len(a.observed.requests) + len(b.observed.requests) == 1
            assert not [
                o
                for o in ("continued", "gave_up", "impossible", "refused", "finished")
                if gw.metric("llmgw_stream_continuations_total", {"model": "fake-model", "outcome": o})
            ]


async def test_a_continuation_that_gets_no_first_byte_is_not_tried_again() -> None:
    # As for a first attempt: the engine may still be reading the prompt, another would double it.
    dying = FakeEngineBehavior(close_mid_stream_after=2)
    silent = FakeEngineBehavior(hang_before_first_byte=True)
    async with run_fake_engine(dying) as a, run_fake_engine(silent) as b, run_fake_engine(silent) as c:
        async with running_gateway(
            endpoint("a", a.url, weight=1000), endpoint("b", b.url), endpoint("c", c.url), first_byte_timeout=0.3
        ) as gw:
            response = await gw.client.post("/v1/chat/completions", json=chat_body(stream=True))
            events = sse(response.text)
            assert "[DONE]" not in events and events[-1]["error"]["code"] == "upstream_timeout"
            assert _text(events) == "tok0 tok1 "
            assert len(b.observed.requests) + len(c.observed.requests) == 1


async def test_a_continued_stream_is_charged_what_both_engines_did() -> None:
    # The client does not ask for usage: the continuation asks for it anyway, and drops it from
    # the client's stream, so the quota is charged the engines' own counts, not an estimate.
    behavior = FakeEngineBehavior(prompt_tokens=10, close_mid_stream_after=3, stream_fault_times=1)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url)) as gw:
            service = gw.tenancy.service
            group = await service.create_group("acme")
            created = await service.create_key(name="k", group_id=group.id)
            response = await gw.client.post(
                "/v1/chat/completions",
                json=chat_body(stream=True),
                headers={"authorization": f"Bearer {created.secret}"},
            )
            events = sse(response.text)
            assert events[-1] == "[DONE]" and _text(events) == FULL
            assert not [e for e in events if isinstance(e, dict) and "usage" in e]
            assert len(a.observed.requests) + len(b.observed.requests) == 2

            async def counted() -> Any:
                totals = await service.usage_totals(group_id=group.id)
                return totals if totals.requests >= 1 else None

            totals = await wait_until(counted, timeout=5, interval=0.01)
            # The first engine read 10 prompt tokens, the second 10 + the 3 it was handed; 8 generated.
            assert (totals.prompt_tokens, totals.completion_tokens) == (23, 8)


@pytest.mark.slow  # left out of the quick tier: a stream cut at every byte, seconds in all
@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["chat", "completions"]),
    cut=st.integers(min_value=1, max_value=3000),
    wants_usage=st.booleans(),
)
async def test_the_fake_engines_stream_cut_at_any_byte_reads_whole_through_the_gateway(
    kind: str,
    cut: int,
    wants_usage: bool,
) -> None:
    behavior = FakeEngineBehavior(cut_after_bytes=cut, stream_fault_times=1)
    body: dict[str, Any] = {"model": "fake-model", "stream": True, "max_tokens": 8}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if kind == "chat" else {"prompt": "Once"})
    if wants_usage:
        body["stream_options"] = {"include_usage": True}
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url)) as gw:
            response = await gw.client.post("/v1/chat/completions" if kind == "chat" else "/v1/completions", json=body)
    events = sse(response.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert _text(events) == FULL
    chunks = [e for e in events if e != "[DONE]"]
    assert len({(e["id"], e["created"], e["model"]) for e in chunks}) == 1
    if kind == "chat":
        assert sum("role" in c["delta"] for e in chunks for c in e["choices"]) == 1
    finishes = [c["finish_reason"] for e in chunks for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    usages = [e["usage"] for e in chunks if "usage" in e]
    exact = [{"prompt_tokens": 7, "completion_tokens": 8, "total_tokens": 15}]
    if kind == "completions" or wants_usage:
        # Missing only when the cut fell after the last token (max_tokens), in the finish chunk that
        # carries it (completions) or before the usage chunk (chat): the gateway ends the stream
        # itself then, and no engine told it the prompt's size.
        assert usages in ([], exact)
    else:
        assert usages == []


def _record(kind: str = "chat") -> StreamRecord:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    return StreamRecord(parse_request(ENDPOINTS["/v1/chat/completions"], json.dumps(body).encode()))


def test_an_event_that_never_ends_is_passed_on_not_held_and_ends_the_chance_to_continue() -> None:
    record = _record()
    held = [record.whole_events(b'data: {"x": "' + b"a" * 65536) for _ in range(15)]
    assert held == [b""] * 15  # under the bound: waiting for the rest of the event
    out = record.whole_events(b"a" * (1024 * 1024))
    assert len(out) > 1024 * 1024 and record.overflow
    assert record.whole_events(b'"}\n\n') == b'"}\n\n'


def test_events_ended_by_crlf_are_whole_events_too() -> None:
    record = _record()
    event = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}\r\n\r\n'
    assert record.whole_events(event + event[:10]) == event
    seen = record.seen()
    assert seen.text == "hi" and seen.tokens == 1 and seen.id == "x" and not seen.other
