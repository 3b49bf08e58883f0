"""Pure pieces of the data path: replica choice and usage extraction."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.gateway.balancer import choose
from llmgw_control.gateway.replicas import Replica, ReplicaSet
from llmgw_control.gateway.usage import TAIL_BYTES, StreamTail, TokenUsage, find_usage
from support.candidates import FakeCandidate as R


def test_least_in_flight_wins() -> None:
    replicas = [R("a", in_flight=3), R("b", in_flight=1), R("c", in_flight=2)]
    assert choose(replicas, now=0).id == "b"  # type: ignore[union-attr]


def test_weight_scales_the_load_a_replica_takes() -> None:
    # Four in flight on a weight-4 replica count like one on a weight-1 replica.
    heavy, light = R("heavy", weight=4, in_flight=4), R("light", weight=1, in_flight=1)
    assert choose([heavy, light], now=0) is heavy  # (4+1)/4 < (1+1)/1


def test_a_replica_with_every_slot_busy_is_never_chosen() -> None:
    full, free = R("full", in_flight=2, slots=2), R("free", in_flight=7, slots=8)
    assert choose([full, free], now=0) is free
    assert choose([full, R("also-full", in_flight=8, slots=8)], now=0) is None
    # Not even when the only free one is cooling down: that one is still tried first.
    cooling = R("cooling", in_flight=0, slots=2, cooldown_until=10)
    assert choose([full, cooling], now=5) is cooling


def test_load_is_relative_to_slots() -> None:
    # Three of four slots busy is more loaded than one of three.
    big, small = R("big", in_flight=3, slots=4), R("small", in_flight=1, slots=3)
    assert choose([big, small], now=0) is small  # (1+1)/3 < (3+1)/4
    big.in_flight = 1
    assert choose([big, small], now=0) is big  # (1+1)/4 < (1+1)/3


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.integers(1, 6), st.sampled_from([0.5, 1.0, 2.0]), st.booleans(), st.booleans()),
        max_size=6,
    ),
)
def test_choose_takes_a_free_slot_least_loaded_healthy_first(specs: list[tuple[int, int, float, bool, bool]]) -> None:
    replicas = [
        R(f"r{i}", weight=w, in_flight=min(n, s), slots=s, cooldown_until=10.0 if cool else 0.0)
        for i, (n, s, w, cool, _) in enumerate(specs)
    ]
    exclude = {r.id for r, spec in zip(replicas, specs, strict=True) if spec[4]}
    chosen = choose(replicas, now=5.0, exclude=exclude, rng=random.Random(0))
    free = [r for r in replicas if r.in_flight < r.slots and r.id not in exclude]
    if not free:
        assert chosen is None
        return
    assert chosen in free
    healthy = [r for r in free if r.cooldown_until <= 5.0]
    if healthy:

        def score(r: R) -> float:
            return (r.in_flight + 1) / (r.slots * r.weight)

        assert chosen in healthy and score(chosen) == min(score(r) for r in healthy)


def test_cooling_replicas_are_avoided_while_others_serve() -> None:
    replicas = [R("a", cooldown_until=10), R("b", in_flight=50)]
    assert choose(replicas, now=5).id == "b"  # type: ignore[union-attr]
    assert choose(replicas, now=11).id == "a"  # type: ignore[union-attr]


def test_when_all_are_cooling_the_one_that_recovers_first_is_tried() -> None:
    replicas = [R("a", cooldown_until=30), R("b", cooldown_until=20)]
    assert choose(replicas, now=5).id == "b"  # type: ignore[union-attr]


def test_excluded_replicas_are_never_chosen() -> None:
    assert choose([R("a"), R("b")], now=0, exclude={"a", "b"}) is None
    assert choose([R("a"), R("b")], now=0, exclude={"a"}).id == "b"  # type: ignore[union-attr]
    assert choose([], now=0) is None


def test_ties_are_spread_at_random() -> None:
    rng = random.Random(1)
    picks = {choose([R("a"), R("b"), R("c")], now=0, rng=rng).id for _ in range(50)}  # type: ignore[union-attr]
    assert picks == {"a", "b", "c"}


def test_replica_set_publish_and_withdraw() -> None:
    replicas = ReplicaSet(
        [Replica("a", "http://a", frozenset({"m1", "m2"})), Replica("b", "http://b", frozenset({"m2"}))]
    )
    assert replicas.models() == ["m1", "m2"]
    assert [r.id for r in replicas.for_model("m2")] == ["a", "b"]
    replicas.withdraw("a")
    assert replicas.models() == ["m2"] and replicas.for_model("m1") == []
    replicas.publish(Replica("b", "http://b2", frozenset({"m3"})))  # republish replaces
    assert replicas.models() == ["m3"] and len(replicas) == 1


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"id":"x","usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}', TokenUsage(5, 7)),
        (b'{"usage": {"prompt_tokens": 3, "total_tokens": 3}}', TokenUsage(3, 0)),  # embeddings
        (b'{"usage":null}', None),
        (b'{"choices":[]}', None),
        (
            b'data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: {"usage":{"prompt_tokens":2,'
            b'"completion_tokens":9}}\n\ndata: [DONE]\n\n',
            TokenUsage(2, 9),
        ),
        (b'data: {"usage":{"prompt_tokens":2,"completion_tok', None),  # cut off
        (
            b'{"content":"the word \\"usage\\" in text","usage":{"prompt_tokens":4,"completion_tokens":1}}',
            TokenUsage(4, 1),
        ),
        # Cached prompt tokens: llama-server b11312's usage and timings (as it sends them)...
        (
            b'{"usage":{"completion_tokens":8,"prompt_tokens":164,"total_tokens":172,"prompt_tokens_details":'
            b'{"cached_tokens":149}},"timings":{"cache_n":149,"prompt_n":15}}',
            TokenUsage(164, 8, 149),
        ),
        # ... an older build's timings alone, and counts no engine could mean (above the prompt, negative,
        # not an integer), which count as none.
        (b'{"usage":{"prompt_tokens":20,"completion_tokens":1},"timings":{"cache_n":12}}', TokenUsage(20, 1, 12)),
        (
            b'{"usage":{"prompt_tokens":20,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":21}}}',
            TokenUsage(20, 1, 0),
        ),
        (b'{"usage":{"prompt_tokens":20,"completion_tokens":1},"timings":{"cache_n":-1}}', TokenUsage(20, 1, 0)),
        (
            b'{"usage":{"prompt_tokens":20,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":true}}}',
            TokenUsage(20, 1, 0),
        ),
        (b'{"usage":{"prompt_tokens":20,"completion_tokens":1},"timings":[[[[', TokenUsage(20, 1, 0)),
    ],
)
def test_find_usage(data: bytes, expected: TokenUsage | None) -> None:
    assert find_usage(data) == expected


def test_stream_tail_keeps_the_end_of_a_long_stream() -> None:
    tail = StreamTail()
    for _ in range(10_000):
        tail.feed(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
    tail.feed(b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":10000}}\n\ndata: [DONE]\n\n')
    assert tail.usage() == TokenUsage(8, 10000)
    assert len(tail._buffer) <= 2 * TAIL_BYTES + 200
