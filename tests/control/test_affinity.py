"""Prefix affinity: the key a request gets, and the bounded-load rendezvous choice (property tests)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.gateway.affinity import (
    Affinity,
    affinity_id,
    choose_affine,
    continues_conversation,
    load_bound,
    preference,
)
from llmgw_control.gateway.requests import ENDPOINTS, ParsedRequest
from support.candidates import FakeCandidate as R

CHAT = ENDPOINTS["/v1/chat/completions"]
COMPLETIONS = ENDPOINTS["/v1/completions"]
EMBEDDINGS = ENDPOINTS["/v1/embeddings"]


def chat(messages: Any, **extra: Any) -> ParsedRequest:
    payload = {"model": "m", "messages": messages, **extra}
    return ParsedRequest(CHAT, "m", False, b"", payload)


SYSTEM = {"role": "system", "content": "You are terse. " * 50}


def test_every_turn_of_a_conversation_has_the_same_key() -> None:
    turn1 = [SYSTEM, {"role": "user", "content": "Name a planet."}]
    turn2 = [*turn1, {"role": "assistant", "content": "Mars."}, {"role": "user", "content": "Another."}]
    turn3 = [*turn2, {"role": "assistant", "content": "Venus."}, {"role": "user", "content": "One more."}]
    keys = {affinity_id(chat(t)) for t in (turn1, turn2, turn3)}
    assert len(keys) == 1 and None not in keys


def test_conversations_sharing_a_system_prompt_have_different_keys() -> None:
    a = affinity_id(chat([SYSTEM, {"role": "user", "content": "Question A"}]))
    b = affinity_id(chat([SYSTEM, {"role": "user", "content": "Question B"}]))
    assert a != b


def test_a_session_id_wins_over_the_content() -> None:
    one = chat([{"role": "user", "content": "x"}], user="alice")
    two = chat([{"role": "user", "content": "something else"}], user="alice")
    assert affinity_id(one) == affinity_id(two)
    # The header wins over `user`.
    assert affinity_id(one, "s-1") == affinity_id(chat([{"role": "user", "content": "y"}]), "s-1")
    assert affinity_id(one, "s-1") != affinity_id(one)


def test_completions_key_on_the_prompt_head() -> None:
    head = "Once upon a time " * 400  # longer than the prefix that counts
    one = ParsedRequest(COMPLETIONS, "m", False, b"", {"model": "m", "prompt": head + "A"})
    two = ParsedRequest(COMPLETIONS, "m", False, b"", {"model": "m", "prompt": head + "B"})
    assert affinity_id(one) == affinity_id(two) is not None
    tokens = ParsedRequest(COMPLETIONS, "m", False, b"", {"model": "m", "prompt": [1, 2, 3]})
    assert affinity_id(tokens) is not None
    assert affinity_id(ParsedRequest(EMBEDDINGS, "m", False, b"", {"model": "m", "input": "x"})) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(
    messages=st.lists(
        st.dictionaries(st.sampled_from(["role", "content", "name"]), json_values, max_size=3), min_size=1, max_size=20
    ),
    user=json_values,
    header=st.none() | st.text(max_size=300),
)
def test_odd_input_never_raises(messages: list[dict[str, Any]], user: Any, header: str | None) -> None:
    key = affinity_id(chat(messages, user=user), header)
    assert key is None or len(key) == 16
    assert continues_conversation(chat(messages, user=user)) in (True, False)
    prompt = ParsedRequest(COMPLETIONS, "m", False, b"", {"model": "m", "prompt": user})
    assert affinity_id(prompt) in (None, affinity_id(prompt))


def test_a_conversation_continues_when_anything_follows_its_first_question() -> None:
    opening = [SYSTEM, {"role": "user", "content": "Name a planet."}]
    assert not continues_conversation(chat(opening))
    assert not continues_conversation(chat(opening[1:]))
    assert continues_conversation(
        chat([*opening, {"role": "assistant", "content": "Mars."}, {"role": "user", "content": "Another."}])
    )
    # A tool round trip after the first question carries earlier work too.
    assert continues_conversation(chat([*opening, {"role": "tool", "content": "42"}]))
    # No user message, or not chat: nothing to continue.
    assert not continues_conversation(chat([SYSTEM]))
    assert not continues_conversation(chat("not a list"))
    prompt = ParsedRequest(COMPLETIONS, "m", False, b"", {"model": "m", "prompt": "Once upon"})
    assert not continues_conversation(prompt)


def test_huge_input_is_bounded() -> None:
    # A million system messages and a 10 MB message cost no more than their bounded heads.
    messages = [{"role": "system", "content": "x" * 10_000_000}] + [{"role": "system", "content": "y"}] * 1_000_000
    assert affinity_id(chat(messages)) is not None
    # The first user message is past the messages that count: read as an opening, not continued.
    assert not continues_conversation(chat([*messages, {"role": "user", "content": "hi"}, SYSTEM]))


# ---------------------------------------------------------------------- the choice

keys = st.binary(min_size=16, max_size=16)
replica_ids = st.lists(st.text("abcdefghij0123456789-", min_size=1, max_size=12), min_size=1, max_size=12, unique=True)


def top(replicas: list[R], key: bytes) -> str:
    chosen, _ = choose_affine(replicas, Affinity(key, 0.25), now=0.0)
    assert chosen is not None
    return chosen.id


@settings(max_examples=200)
@given(ids=replica_ids, new=st.text("klmnop", min_size=1, max_size=6), sample=st.lists(keys, min_size=1, max_size=50))
def test_a_joining_replica_takes_only_keys_it_now_wins(ids: list[str], new: str, sample: list[bytes]) -> None:
    before = [R(i) for i in ids]
    after = [*before, R(new)]
    for key in sample:
        old, now = top(before, key), top(after, key)
        assert now in (old, new)


@settings(max_examples=200)
@given(
    ids=replica_ids.filter(lambda ids: len(ids) >= 2), data=st.data(), sample=st.lists(keys, min_size=1, max_size=50)
)
def test_a_leaving_replica_moves_only_its_own_keys(ids: list[str], data: st.DataObject, sample: list[bytes]) -> None:
    gone = data.draw(st.sampled_from(ids))
    before = [R(i) for i in ids]
    after = [r for r in before if r.id != gone]
    for key in sample:
        old = top(before, key)
        if old != gone:
            assert top(after, key) == old


@given(
    ids=replica_ids,
    loads=st.lists(st.integers(0, 20), min_size=12, max_size=12),
    key=keys,
    shuffle=st.randoms(use_true_random=False),
)
def test_the_choice_is_deterministic_and_ignores_list_order(
    ids: list[str], loads: list[int], key: bytes, shuffle: Any
) -> None:
    replicas = [R(i, in_flight=load) for i, load in zip(ids, loads, strict=False)]
    # Distinct loads so the least-loaded fallback has no tie to break at random.
    for index, replica in enumerate(replicas):
        replica.in_flight = replica.in_flight * 100 + index
    first, hit = choose_affine(replicas, Affinity(key, 0.25), now=0.0)
    mixed = list(replicas)
    shuffle.shuffle(mixed)
    again, hit_again = choose_affine(mixed, Affinity(key, 0.25), now=0.0)
    assert first is again and hit == hit_again


@settings(max_examples=300)
@given(
    n=st.integers(1, 8),
    epsilon=st.sampled_from([0.0, 0.1, 0.25, 1.0]),
    events=st.lists(st.tuples(st.booleans(), st.binary(min_size=16, max_size=16)), max_size=200),
)
def test_the_load_bound_is_never_exceeded(n: int, epsilon: float, events: list[tuple[bool, bytes]]) -> None:
    """Arrivals (keyed, skewed to a few keys) and departures in any order: every replica a request
    is given holds at most (1 + ε) · mean + 1 with that request counted."""
    replicas = [R(f"r{i}") for i in range(n)]
    held: list[R] = []
    for arrive, key in events:
        if arrive or not held:
            # Few distinct keys: the skew that makes a preferred replica hot.
            key = key[:1] * 16
            chosen, _ = choose_affine(replicas, Affinity(key, epsilon), now=0.0)
            assert chosen is not None
            total_after = sum(r.in_flight for r in replicas) + 1
            assert chosen.in_flight + 1 <= (1 + epsilon) * total_after / n + 1 + 1e-9
            chosen.in_flight += 1
            held.append(chosen)
        else:
            held.pop(key[0] % len(held)).in_flight -= 1


def test_an_idle_fleet_sends_a_key_to_its_first_preference() -> None:
    replicas = [R(f"r{i}") for i in range(5)]
    key = b"k" * 16
    chosen, hit = choose_affine(replicas, Affinity(key, 0.25), now=0.0)
    assert chosen is preference(replicas, key)[0] and hit


def test_a_full_or_cooling_first_choice_walks_the_order() -> None:
    replicas = [R(f"r{i}", slots=2) for i in range(4)]
    key = b"q" * 16
    order = preference(replicas, key)
    order[0].in_flight = 2  # full
    chosen, hit = choose_affine(replicas, Affinity(key, 10.0), now=0.0)
    assert chosen is order[1] and not hit
    order[1].cooldown_until = 5.0
    chosen, _ = choose_affine(replicas, Affinity(key, 10.0), now=0.0)
    assert chosen is order[2]
    # Excluded (a retry): the next in the order, never the one that failed.
    chosen, _ = choose_affine(replicas, Affinity(key, 10.0), now=0.0, exclude={order[2].id})
    assert chosen is order[3]


def test_weights_scale_the_bound() -> None:
    heavy, light = R("heavy", weight=3.0), R("light")
    assert load_bound(heavy, [heavy, light], 0.0) == 3 * load_bound(light, [heavy, light], 0.0) - 2


def test_weighted_rendezvous_shares_keys_by_weight() -> None:
    replicas = [R("a", weight=1.0), R("b", weight=3.0)]
    counts = {"a": 0, "b": 0}
    for i in range(4000):
        counts[preference(replicas, i.to_bytes(16, "big"))[0].id] += 1
    assert 0.7 < counts["b"] / 4000 < 0.8
