"""Control removes model files nodes keep for nothing: unused past weights_keep_for, or LRU for a download."""

from __future__ import annotations

import attrs
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.catalog import Catalog, Claim, EngineConfig, ModelConfig, ProfileConfig, WeightsConfig
from llmgw_control.fleet.inventory import Inventory, Liveness, NodeRecord
from llmgw_control.fleet.reconciler import Reconciler, ReconcilerConfig
from llmgw_control.fleet.weights_gc import expired, room_for_download
from llmgw_control.gateway.replicas import ReplicaSet
from llmgw_shared.facts import HostFacts, unprobed
from llmgw_shared.wire import Command, EngineState, RemoveWeights, ReplicaState, StartReplica, WeightsHeld

DAY = 86400.0
NOW = 1_800_000_000.0
A, B, C = "a" * 64, "b" * 64, "c" * 64


def held(sha: str, *, size: int = 1 << 30, age: float = 0.0, in_use: bool = False) -> WeightsHeld:
    return WeightsHeld(sha, size, NOW - age, in_use)


def test_files_unused_past_keep_for_go_but_never_one_in_use() -> None:
    files = [held(A, age=8 * DAY), held(B, age=8 * DAY, in_use=True), held(C, age=1 * DAY)]
    assert expired(files, set(), now=NOW, keep_for=7 * DAY) == [A]
    assert expired(files, {A}, now=NOW, keep_for=7 * DAY) == []  # control's replica there uses it
    assert expired(files, set(), now=NOW, keep_for=0) == []  # 0: never by age


def test_a_download_that_does_not_fit_removes_the_least_recently_used_as_few_as_needed() -> None:
    files = [held(A, age=3 * DAY), held(B, age=5 * DAY, in_use=True), held(C, age=4 * DAY)]
    assert room_for_download(files, set(), need=3 << 30, free=2 << 30) == [C]
    assert room_for_download(files, set(), need=4 << 30, free=2 << 30) == [C, A]
    assert room_for_download(files, set(), need=5 << 30, free=2 << 30) == []  # hopeless: keep everything
    assert room_for_download(files, set(), need=1 << 30, free=2 << 30) == []  # fits already


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([A, B, C, "d" * 64, "e" * 64]), st.integers(0, 10), st.floats(0, 30), st.booleans()),
        max_size=8,
        unique_by=lambda t: t[0],
    ),
    st.sets(st.sampled_from([A, B, C])),
    st.integers(0, 40),
    st.integers(0, 40),
)
def test_nothing_in_use_is_ever_removed(
    files: list[tuple[str, int, float, bool]], in_use: set[str], need: int, free: int
) -> None:
    cache = [held(sha, size=size, age=age * DAY, in_use=used) for sha, size, age, used in files]
    busy = in_use | {w.sha256 for w in cache if w.in_use}
    for removed in (
        expired(cache, in_use, now=NOW, keep_for=7 * DAY),
        room_for_download(cache, in_use, need=need, free=free),
    ):
        assert not set(removed) & busy


class Dispatcher:
    def __init__(self) -> None:
        self.sent: list[Command] = []

    def send(self, node_id: str, command: Command) -> bool:
        self.sent.append(command)
        return True


def _world(*, disk_free_mib: int = 100_000, weights: list[WeightsHeld]) -> tuple[Reconciler, Dispatcher, NodeRecord]:
    profile = ProfileConfig(name="cpu", weights=WeightsConfig("http://files/m.gguf", A, 3 << 30), min_replicas=1)
    catalog = Catalog([ModelConfig("m", [profile])], [EngineConfig()])
    inventory, dispatcher = Inventory(), Dispatcher()
    reconciler = Reconciler(
        catalog,
        inventory,
        Liveness(15, 60),
        dispatcher,
        ReplicaSet(),
        secret=b"s" * 32,
        claims={"m:cpu": Claim(100)},
        config=ReconcilerConfig(weights_keep_for=7 * DAY),
        clock=trio.current_time,
        wall_clock=lambda: NOW,
    )
    facts: HostFacts = attrs.evolve(unprobed(), probed=True, ram_total_mib=16000, disk_free_mib=disk_free_mib)
    node = NodeRecord("n1", "10.0.0.1", facts, last_seen=trio.current_time(), weights=weights)
    node.update_engines([EngineState("llama.cpp", "b11312", "installed")])
    inventory.put(node)
    return reconciler, dispatcher, node


async def test_the_reconciler_removes_what_is_stale_and_keeps_what_its_replica_uses(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reconciler, dispatcher, node = _world(weights=[held(A, age=30 * DAY), held(B, age=30 * DAY), held(C)])
    reconciler.reconcile_once()
    (start,) = [c for c in dispatcher.sent if isinstance(c, StartReplica)]
    removals = [c for c in dispatcher.sent if isinstance(c, RemoveWeights)]
    # A is old but the replica just placed uses it; B is old and unused; C was used today.
    assert [r.sha256 for r in removals] == [[B]]
    node.update_replicas([ReplicaState(start.replica.replica_id, "ready", port=start.replica.port)])
    dispatcher.sent.clear()
    reconciler.reconcile_once()
    assert dispatcher.sent == []  # looked at once a minute, not every pass
    assert reconciler.weights_in_use("n1") == {A: ["m:cpu"]}


async def test_a_start_whose_download_does_not_fit_first_removes_the_least_recently_used(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 2 GiB free (and the node's 256 MiB margin); the 3 GiB model needs B (older) and C removed.
    reconciler, dispatcher, _ = _world(
        disk_free_mib=2048 + 256, weights=[held(B, size=512 << 20, age=2 * DAY), held(C, size=1 << 30, age=1 * DAY)]
    )
    reconciler.reconcile_once()
    kinds = [type(c).__name__ for c in dispatcher.sent]
    assert kinds == ["RemoveWeights", "StartReplica"]  # the room first, on the same ordered connection
    removal = dispatcher.sent[0]
    assert isinstance(removal, RemoveWeights) and removal.sha256 == [B, C]
