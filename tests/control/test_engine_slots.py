"""Naming llama-server's slot per conversation (gateway/engine_slots.py).

Pure: a key keeps its slot while the slot is free, conversations taking turns (no more of them than
slots) each get back the slot that holds their history, a new one takes the least recently used,
no two requests in flight hold one slot, no slot outside the engine's, nothing when the engine
cannot be told; through the gateway on a fake engine:
the body carries the key's ``id_slot`` (in place of a client's), and nothing without prefix routing
or without ``engine_slots``.
"""

from __future__ import annotations

import functools
from typing import Any

import hypothesis.strategies as st
import trio
from hypothesis import given, settings

from llmgw_control.gateway.engine_slots import claim_engine_slot, give_back_engine_slot
from llmgw_control.gateway.replicas import Replica
from llmgw_dev.fake_engine import FakeEngineBehavior, run_fake_engine
from support.gateway import endpoint, running_gateway


def replica(engine_slots: int) -> Replica:
    return Replica(id="r1", url="http://127.0.0.1:1", models=frozenset({"m"}), slots=8, engine_slots=engine_slots)


def test_a_key_keeps_its_slot_while_it_is_free() -> None:
    r = replica(4)
    first = claim_engine_slot(r, b"conversation-1")
    give_back_engine_slot(r, first)
    assert all(
        claim_engine_slot(r, b"conversation-1") == first and give_back_engine_slot(r, first) is None for _ in range(5)
    )


def test_keys_spread_over_the_slots() -> None:
    r = replica(4)
    chosen = set()
    for number in range(64):
        slot = claim_engine_slot(r, f"conversation-{number}".encode())
        give_back_engine_slot(r, slot)
        chosen.add(slot)
    assert chosen == {0, 1, 2, 3}


@settings(max_examples=200, deadline=None)
@given(engine_slots=st.integers(1, 8), data=st.data())
def test_conversations_taking_turns_each_get_back_the_slot_holding_their_history(
    engine_slots: int,
    data: st.DataObject,
) -> None:
    # Red on the rendezvous choice this replaced: two keys whose hashes preferred one slot took it
    # from each other on every turn (four conversations on four slots: 91% of the time).
    r = replica(engine_slots)
    keys = [f"conversation-{n}".encode() for n in range(data.draw(st.integers(1, engine_slots)))]
    turns = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=40))
    home: dict[bytes, int] = {}
    for key in turns:
        slot = claim_engine_slot(r, key)
        assert slot is not None
        assert home.setdefault(key, slot) == slot
        assert slot not in {s for k, s in home.items() if k != key}
        give_back_engine_slot(r, slot)


def test_a_new_conversation_takes_the_slot_used_least_recently() -> None:
    r = replica(3)
    for key in (b"a", b"b", b"c"):
        give_back_engine_slot(r, claim_engine_slot(r, key))
    slot_of_a = claim_engine_slot(r, b"a")  # a is now the most recent; b waited longest
    give_back_engine_slot(r, slot_of_a)
    [slot_of_b] = [slot for slot, owner in r.engine_slot_owners.items() if owner == b"b"]
    assert claim_engine_slot(r, b"newcomer") == slot_of_b


def test_a_conversation_whose_slot_is_busy_takes_another_and_never_waits() -> None:
    r = replica(2)
    own = claim_engine_slot(r, b"a")
    give_back_engine_slot(r, own)
    busy = claim_engine_slot(r, b"a")
    assert busy == own
    other = claim_engine_slot(r, b"a")
    assert other is not None and other != own
    assert claim_engine_slot(r, b"a") is None  # every slot held: the engine chooses


def test_an_engine_that_cannot_be_told_gets_no_slot() -> None:
    r = replica(0)
    assert claim_engine_slot(r, b"k") is None
    give_back_engine_slot(r, None)
    assert r.held_engine_slots == set()


@settings(max_examples=200, deadline=None)
@given(
    engine_slots=st.integers(1, 6),
    steps=st.lists(st.tuples(st.booleans(), st.binary(min_size=1, max_size=8)), max_size=60),
)
def test_no_two_requests_in_flight_hold_one_slot(engine_slots: int, steps: list[tuple[bool, bytes]]) -> None:
    r = replica(engine_slots)
    holding: list[int | None] = []
    for claim, key in steps:
        if claim or not holding:
            slot = claim_engine_slot(r, key)
            held = [s for s in holding if s is not None]
            if len(held) == engine_slots:
                assert slot is None  # every slot held: the engine chooses
            else:
                assert slot is not None and 0 <= slot < engine_slots and slot not in held
            holding.append(slot)
        else:
            give_back_engine_slot(r, holding.pop(len(key) % len(holding)))
        assert r.held_engine_slots == {s for s in holding if s is not None}
    for slot in holding:
        give_back_engine_slot(r, slot)
    assert r.held_engine_slots == set()


def _chat(number: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Question {number}"}],
        **extra,
    }


async def test_prefix_routing_names_the_conversations_slot_in_the_body() -> None:
    async with run_fake_engine() as engine:
        async with running_gateway(endpoint("a", engine.url, engine_slots=4), routing="prefix") as gw:
            for _turn in range(2):
                for number in range(4):
                    # A client's own id_slot is replaced: the gateway knows which slots it holds.
                    extra = {"id_slot": 99} if number == 0 else {}
                    response = await gw.client.post("/v1/chat/completions", json=_chat(number, **extra))
                    assert response.status_code == 200
            slots = [r.json["id_slot"] for r in engine.observed.requests if r.path == "/v1/chat/completions"]
            assert all(0 <= s < 4 for s in slots)
            # One slot per conversation (four conversations, four slots), the same on both turns.
            assert sorted(slots[:4]) == [0, 1, 2, 3]
            assert slots[:4] == slots[4:]


async def test_concurrent_requests_hold_different_slots() -> None:
    async with run_fake_engine(FakeEngineBehavior(hang_before_first_byte=True)) as engine:
        async with running_gateway(endpoint("a", engine.url, slots=4, engine_slots=4), routing="prefix") as gw:
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    # One conversation four times at once: its slot, then the next free ones.
                    nursery.start_soon(functools.partial(gw.client.post, "/v1/chat/completions", json=_chat(1)))
                with trio.fail_after(30):
                    await engine.observed.wait_in_flight(4)
                nursery.cancel_scope.cancel()
            slots = [r.json["id_slot"] for r in engine.observed.requests if r.path == "/v1/chat/completions"]
            assert sorted(slots) == [0, 1, 2, 3]


async def test_no_slot_is_named_without_prefix_routing_or_engine_slots() -> None:
    async with run_fake_engine() as a, run_fake_engine() as b:
        async with running_gateway(endpoint("a", a.url, engine_slots=4), routing="least-loaded") as gw:
            assert (await gw.client.post("/v1/chat/completions", json=_chat(1))).status_code == 200
        async with running_gateway(endpoint("b", b.url), routing="prefix") as gw:
            assert (await gw.client.post("/v1/chat/completions", json=_chat(1))).status_code == 200
        assert all(
            "id_slot" not in r.json for e in (a, b) for r in e.observed.requests if r.path == "/v1/chat/completions"
        )
