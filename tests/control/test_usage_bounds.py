"""Engine-reported usage is read within bounds, in one place (gateway/usage.py): over arbitrary
usage objects, whatever an engine sends comes out as integers between 0 and what the request
could have produced, or as no usage at all (issue 29 §4)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.gateway.continuation import Seen, StreamRecord
from llmgw_control.gateway.requests import ENDPOINTS, ParsedRequest, parse_request
from llmgw_control.gateway.usage import (
    TOKEN_CAP,
    StreamTail,
    TokenUsage,
    UsageBounds,
    find_usage,
    read_usage,
    usage_bounds,
)

# Whatever JSON can hold, and then some: huge and negative integers, floats (with NaN and the
# infinities Python's json writes and reads back), bools, strings, nested junk.
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**62, max_value=10**40)
    | st.integers(max_value=-1)
    | st.floats()
    | st.text(max_size=8)
)
_junk = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
_count = st.one_of(st.integers(min_value=0, max_value=5000), _junk)
_usage_objects = (
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": _count,
            "completion_tokens": _count,
            "total_tokens": _count,
            "prompt_tokens_details": _junk | st.fixed_dictionaries({"cached_tokens": _count}),
        },
    )
    | _junk
)
_bounds = st.builds(UsageBounds, st.integers(0, TOKEN_CAP), st.integers(0, TOKEN_CAP))


def _plain_int(value: object) -> bool:
    return type(value) is int


def _within(usage: TokenUsage, bounds: UsageBounds) -> None:
    assert _plain_int(usage.prompt_tokens) and _plain_int(usage.completion_tokens) and _plain_int(usage.cached_tokens)
    assert 0 <= usage.prompt_tokens <= bounds.prompt
    assert 0 <= usage.completion_tokens <= bounds.completion
    assert 0 <= usage.cached_tokens <= usage.prompt_tokens


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@settings(max_examples=400, deadline=None)
@given(value=_usage_objects, bounds=_bounds)
def test_any_usage_object_reads_as_bounded_counts_or_none(value: Any, bounds: UsageBounds) -> None:
    usage = read_usage(value, bounds)
    if usage is None:
        # Only when there is no integer prompt count (or a completion count of the wrong type).
        assert not (
            isinstance(value, dict)
            and _is_count(value.get("prompt_tokens"))
            and _is_count(value.get("completion_tokens", 0))
        )
        return
    _within(usage, bounds)
    assert isinstance(value, dict)
    prompt, completion = value["prompt_tokens"], value.get("completion_tokens", 0)
    # A count within bounds is taken as it is; one outside is clamped, and the clamp says so.
    expected_clamps = {
        name
        for name, count, bound in (
            ("prompt_tokens", prompt, bounds.prompt),
            ("completion_tokens", completion, bounds.completion),
        )
        if not 0 <= count <= bound
    }
    assert {c.field for c in usage.clamped} == expected_clamps
    if not expected_clamps:
        assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, completion)
    for clamp in usage.clamped:
        assert len(clamp.describe()) < 120  # a log line, whatever the integer


@settings(max_examples=300, deadline=None)
@given(value=_usage_objects, timings=_junk, bounds=_bounds, streamed=st.booleans())
def test_any_usage_in_an_engine_answer_reads_as_bounded_counts_or_none(
    value: Any, timings: Any, bounds: UsageBounds, streamed: bool
) -> None:
    event = {"id": "x", "choices": [], "usage": value, "timings": timings}
    text = json.dumps(event)  # NaN and Infinity as Python writes them: JSON engines would refuse them
    data = f"data: {text}\n\ndata: [DONE]\n\n".encode() if streamed else text.encode()
    if streamed:
        tail = StreamTail(bounds)
        tail.feed(data)
        usage = tail.usage()
    else:
        usage = find_usage(data, bounds)
    if usage is not None:
        _within(usage, bounds)


def test_an_integer_too_long_to_decode_is_no_usage() -> None:
    # Python refuses to read an integer of more than 4,300 digits: no usage, no exception.
    data = b'{"usage":{"prompt_tokens":' + b"9" * 5000 + b',"completion_tokens":1}}'
    assert find_usage(data) is None


def _chat(**extra: Any) -> ParsedRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], **extra}
    return parse_request(ENDPOINTS["/v1/chat/completions"], json.dumps(body).encode())


def test_bounds_come_from_the_request() -> None:
    request = _chat(max_tokens=5)
    bounds = usage_bounds(request)
    assert bounds.completion == 5
    assert len(request.body) < bounds.prompt < 2 * 4096
    assert usage_bounds(_chat(max_tokens=5, n=3)).completion == 15
    assert usage_bounds(_chat(max_completion_tokens=7)).completion == 7
    # No max_tokens (or one that says nothing): the absolute cap.
    assert usage_bounds(_chat()).completion == TOKEN_CAP
    assert usage_bounds(_chat(max_tokens=0)).completion == TOKEN_CAP
    assert usage_bounds(_chat(max_tokens=10**30, n=10**6)).completion == TOKEN_CAP
    # An image's tokens are not in the body's bytes: only the absolute cap holds the prompt.
    image = [{"type": "text", "text": "what is it"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    assert usage_bounds(_chat(messages=[{"role": "user", "content": image}])).prompt == TOKEN_CAP
    embeddings = parse_request(ENDPOINTS["/v1/embeddings"], b'{"model":"m","input":["a","b"]}')
    assert usage_bounds(embeddings).completion == 0 and usage_bounds(embeddings).prompt < TOKEN_CAP
    completions = parse_request(ENDPOINTS["/v1/completions"], b'{"model":"m","prompt":[[1,2,3]],"max_tokens":4}')
    assert usage_bounds(completions) == UsageBounds(len(completions.body) * 11 + 4096, 4)


def test_a_prompt_is_never_longer_than_the_replicas_context() -> None:
    # The engine said how many tokens one request may hold (llama-server's per-slot n_ctx): an
    # image's prompt, unbounded by its bytes, is bounded by that (issue 29: the context size).
    image = [{"type": "text", "text": "what is it"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    request = _chat(messages=[{"role": "user", "content": image}], max_tokens=5)
    assert usage_bounds(request, context=8192) == UsageBounds(8192, 5)
    assert usage_bounds(_chat(), context=4).prompt == 4
    # An engine that said nothing, or nonsense, leaves the request's own bounds.
    assert usage_bounds(_chat(), context=None) == usage_bounds(_chat()) == usage_bounds(_chat(), context=0)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), max_tokens=st.integers(1, 10**6), n=st.integers(1, 8))
def test_what_an_honest_engine_reports_is_never_clamped(text: str, max_tokens: int, n: int) -> None:
    # Its prompt is at most a token a byte of the text, plus the template; it generates at most
    # max_tokens for each choice.
    request = _chat(
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": text}],
        max_tokens=max_tokens,
        n=n,
    )
    honest = {"prompt_tokens": len(text.encode()) + 200, "completion_tokens": max_tokens * n}
    usage = read_usage(honest, usage_bounds(request))
    assert usage == TokenUsage(honest["prompt_tokens"], honest["completion_tokens"])


def test_a_continued_stream_charges_bounded_counts() -> None:
    request = parse_request(
        ENDPOINTS["/v1/chat/completions"],
        json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 10}
        ).encode(),
    )
    record = StreamRecord(request)
    record.continue_after(Seen(text="abc", tokens=3))
    assert record.splice is not None
    event = {"id": "b", "choices": [], "usage": {"prompt_tokens": 10**20, "completion_tokens": -4}}
    record.splice.feed(b"data: " + json.dumps(event).encode() + b"\n\n")
    charged = record.splice.charged
    assert charged is not None
    # Two attempts read the prompt: each bounded by the request and the text carried over.
    assert 0 <= charged.prompt_tokens <= 2 * usage_bounds(request, prefill_bytes=3).prompt
    assert charged.completion_tokens == 3  # what the client received, and nothing from the engine
    assert {c.field for c in charged.clamped} == {"prompt_tokens", "completion_tokens"}
