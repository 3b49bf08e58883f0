"""New conversations go least-loaded and are remembered (gateway/placements.py, affinity.pick).

Pure: the memory is a bounded LRU that keeps the latest replica of the most recent keys; a new
conversation (a first turn keyed by its content, an unplaced session) is always placed on a
least loaded replica (so keys that never come back cost no balance: red on the rendezvous-only
choice), a remembered one goes back to its replica over its rendezvous order, a forgotten
replica or an unplaced request carrying earlier turns falls back to the rendezvous order every
daemon agrees on, and the load bound still holds for all of it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.gateway.affinity import Affinity, pick, preference
from llmgw_control.gateway.placements import Placements
from support.candidates import FakeCandidate as R

keys = st.binary(min_size=16, max_size=16)


# ---------------------------------------------------------------------- the memory


@given(
    capacity=st.integers(1, 8),
    records=st.lists(st.tuples(st.binary(min_size=1, max_size=2), st.sampled_from("abc")), max_size=60),
)
def test_the_memory_keeps_the_latest_replica_of_the_most_recent_keys(
    capacity: int, records: list[tuple[bytes, str]]
) -> None:
    memory = Placements(capacity)
    for key, replica in records:
        memory.record("m", key, replica)
        assert len(memory) <= capacity
    latest: dict[bytes, str] = {}
    recent: list[bytes] = []
    for key, replica in records:
        latest[key] = replica
        if key in recent:
            recent.remove(key)
        recent.append(key)
    for key in recent[-capacity:]:
        assert memory.get("m", key) == latest[key]
    for key in recent[:-capacity]:
        assert memory.get("m", key) is None


def test_the_memory_is_per_model() -> None:
    memory = Placements()
    memory.record("chat", b"alice", "r1")
    memory.record("code", b"alice", "r7")
    assert memory.get("chat", b"alice") == "r1" and memory.get("code", b"alice") == "r7"
    assert memory.get("other", b"alice") is None


def test_a_memory_holds_at_least_one_key() -> None:
    with pytest.raises(ValueError):
        Placements(0)


# ---------------------------------------------------------------------- the choice


def place(
    replicas: list[R], memory: Placements, key: bytes, *, continues: bool, session: bool = False, epsilon: float = 0.25
) -> tuple[R, str]:
    """What the activator does: read the memory, pick, write the memory."""
    affinity = Affinity(key, epsilon, continues, session=session)
    chosen, outcome = pick(replicas, affinity, now=0.0, placed=memory.get("m", key))
    assert chosen is not None and outcome is not None
    memory.record("m", key, chosen.id)
    return chosen, outcome


@settings(max_examples=300)
@given(n=st.integers(2, 6), events=st.lists(st.tuples(st.booleans(), keys), max_size=200))
def test_new_conversations_keep_the_replicas_balanced(n: int, events: list[tuple[bool, bytes]]) -> None:
    """Keys that never come back (a unique-prompt workload), arriving and leaving in any order:
    every arrival lands on a least loaded replica, so arrivals never let one replica run ahead
    of the others. The rendezvous choice alone lets the preferred one run ahead within its bound."""
    replicas = [R(f"r{i}") for i in range(n)]
    memory = Placements()
    held: list[R] = []
    seen: set[bytes] = set()
    for arrive, key in events:
        if key in seen:
            continue
        seen.add(key)
        if arrive or not held:
            fewest = min(r.in_flight for r in replicas)
            spread = max(r.in_flight for r in replicas) - fewest
            chosen, outcome = place(replicas, memory, key, continues=False)
            assert outcome == "new" and chosen.in_flight == fewest
            chosen.in_flight += 1
            held.append(chosen)
            # An arrival never widens the spread (departures may; the next arrivals close it).
            assert max(r.in_flight for r in replicas) - min(r.in_flight for r in replicas) <= max(spread, 1)
        else:
            held.pop(key[0] % len(held)).in_flight -= 1


def test_a_conversation_goes_back_where_it_was_placed_not_where_its_hash_points() -> None:
    replicas = [R(f"r{i}") for i in range(4)]
    memory = Placements()
    key = b"c" * 16
    favourite = preference(replicas, key)[0]
    favourite.in_flight = 3  # busy when the conversation opens: it goes elsewhere
    first, outcome = place(replicas, memory, key, continues=False)
    assert first is not favourite and outcome == "new"
    favourite.in_flight = 0
    for _ in range(5):
        again, outcome = place(replicas, memory, key, continues=True)
        assert again is first and outcome == "hit"


@settings(max_examples=200)
@given(n=st.integers(2, 5), repeats=st.integers(1, 30), key=keys)
def test_identical_first_turns_are_spread_by_load_a_session_is_kept(n: int, repeats: int, key: bytes) -> None:
    """The same first turn keyed by its content, sent again and again while the others are in
    flight: each goes to a least loaded replica (they share nothing in flight). The same under an
    explicit session stays on its replica while the bound allows."""
    replicas = [R(f"r{i}") for i in range(n)]
    memory = Placements()
    for _ in range(repeats):
        fewest = min(r.in_flight for r in replicas)
        chosen, outcome = place(replicas, memory, key, continues=False)
        assert outcome == "new" and chosen.in_flight == fewest
        chosen.in_flight += 1
    replicas = [R(f"r{i}") for i in range(n)]
    memory = Placements()
    for replica in replicas[1:]:
        replica.in_flight = 1  # others busy, so the session's first request is placed by load
    home, outcome = place(replicas, memory, key, continues=False, session=True)
    assert home is replicas[0] and outcome == "new"
    for replica in replicas:
        replica.in_flight = 0
    for _ in range(repeats):
        again, outcome = place(replicas, memory, key, continues=False, session=True)
        assert again is home and outcome == "hit"


def test_a_placed_conversation_over_the_bound_moves_and_is_remembered_where_it_moved() -> None:
    replicas = [R("a"), R("b")]
    memory = Placements()
    key = b"m" * 16
    memory.record("m", key, "a")
    replicas[0].in_flight = 5  # far over (1 + 0.25) * 6 / 2 + 1
    moved, outcome = place(replicas, memory, key, continues=True)
    assert moved.id == "b" and outcome == "miss"
    # Its newest history is on b now: the next turn goes there.
    replicas[0].in_flight = 0
    again, outcome = place(replicas, memory, key, continues=True)
    assert again.id == "b" and outcome == "hit"


def test_an_unplaced_request_with_earlier_turns_takes_its_rendezvous_order() -> None:
    """Another daemon (or this one before a restart) served its earlier turns: the order every
    daemon agrees on is where they went."""
    replicas = [R(f"r{i}") for i in range(4)]
    key = b"d" * 16
    favourite = preference(replicas, key)[0]
    favourite.in_flight = 1  # not the least loaded, still within its bound: 2 <= (1 + 1) * 2 / 4 + 1
    chosen, outcome = place(replicas, Placements(), key, continues=True, epsilon=1.0)
    assert chosen is favourite and outcome == "hit"


def test_a_conversation_whose_replica_left_is_placed_as_if_unseen() -> None:
    replicas = [R("a"), R("b"), R("c")]
    key = b"g" * 16
    memory = Placements()
    memory.record("m", key, "gone")
    favourite = preference(replicas, key)[0]
    favourite.in_flight = 1
    # With earlier turns: the rendezvous order (within the bound: 2 <= (1 + 1) * 2 / 3 + 1).
    chosen, _ = place(replicas, memory, key, continues=True, epsilon=1.0)
    assert chosen is favourite
    # Without: the least loaded.
    memory.record("m", key, "gone")
    chosen, outcome = place(replicas, memory, key, continues=False, epsilon=1.0)
    assert chosen.in_flight == 0 and outcome == "new"


def test_a_retry_never_goes_back_to_the_replica_that_failed() -> None:
    replicas = [R("a"), R("b")]
    key = b"r" * 16
    chosen, outcome = pick(replicas, Affinity(key, 0.25, True), now=0.0, placed="a", exclude={"a"})
    assert chosen is not None and chosen.id == "b" and outcome == "hit"


@settings(max_examples=300)
@given(
    n=st.integers(1, 6),
    epsilon=st.sampled_from([0.0, 0.25, 1.0]),
    events=st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 3)), max_size=200),
)
def test_the_load_bound_holds_for_remembered_conversations(
    n: int, epsilon: float, events: list[tuple[bool, bool, int]]
) -> None:
    """A few conversations, each remembered, arriving (with or without earlier turns) and leaving
    in any order: a replica given a request by its memory holds at most (1 + ε) · mean + 1."""
    replicas = [R(f"r{i}") for i in range(n)]
    memory = Placements()
    held: list[R] = []
    for arrive, continues, conversation in events:
        if arrive or not held:
            key = bytes([conversation]) * 16
            placed = memory.get("m", key)
            chosen, outcome = place(replicas, memory, key, continues=continues, epsilon=epsilon)
            if outcome == "hit" and placed is not None:
                total_after = sum(r.in_flight for r in replicas) + 1
                assert chosen.in_flight + 1 <= (1 + epsilon) * total_after / n + 1 + 1e-9
            chosen.in_flight += 1
            held.append(chosen)
        else:
            held.pop(conversation % len(held)).in_flight -= 1
