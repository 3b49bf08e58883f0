"""Leadership in the control daemon: the lease's role drives agents, reconciler, refusals, fencing.

Two daemons' worth of real parts (agent service, reconciler, keeper) over one in-memory lease
row in fake time, with scripted nodes on in-memory sockets; plus the standby's client answer,
config checks, and the cluster secrets on a real PostgreSQL server.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from llmgw_control.catalog import Catalog, Claim, EngineConfig, ModelConfig, ProfileConfig, WeightsConfig
from llmgw_control.config import ControlConfig, validate
from llmgw_control.fleet.agents import AgentsConfig, AgentService, token_digest
from llmgw_control.fleet.events import NodeEvents
from llmgw_control.fleet.inventory import Inventory, Liveness
from llmgw_control.fleet.leadership import (
    Leadership,
    LeadershipConfig,
    StandbyGate,
    clear_single_daemon_lease,
)
from llmgw_control.fleet.reconciler import Reconciler, ReconcilerConfig
from llmgw_control.gateway.replicas import ReplicaSet
from llmgw_control.store import FleetHolders, LeaseKeeper, cluster_secret, connect_store
from llmgw_control.store.testing import LeaseRow, MemoryLease
from llmgw_dev.postgres import PostgresServer
from llmgw_shared.config import ConfigError
from llmgw_shared.facts import unprobed
from llmgw_shared.wire import PROTOCOL_VERSION, EngineState, Hello, ReplicaState, encode

TTL, RENEW, SETTLE = 2.0, 0.5, 1.0
JOIN_TOKEN = "llmgw-join-leadership-test"


# --------------------------------------------------------------------------- a daemon's parts


@attrs.define
class Daemon:
    name: str
    lease: MemoryLease
    leadership: Leadership
    agents: AgentService
    reconciler: Reconciler
    replicas: ReplicaSet

    @property
    def address(self) -> str:
        return f"ws://{self.name}/agent/v1"


class MemoryHolders:
    """The store's fleet_holders row, in memory and on trio's clock (see ops_fleet)."""

    def __init__(self) -> None:
        self.held: FleetHolders | None = None
        self.writes = 0

    async def fleet_holders(self) -> FleetHolders | None:
        await trio.sleep(0.001)
        return self.held

    async def remember_holders(self, epoch: int, nodes: Iterable[str]) -> bool:
        await trio.sleep(0.001)
        if self.held is not None and self.held.epoch > epoch:
            return False
        self.writes += 1
        self.held = FleetHolders(epoch, frozenset(nodes), datetime.now(UTC))
        return True


def make_daemon(row: LeaseRow, name: str, *, settle: float = SETTLE, memory: MemoryHolders | None = None) -> Daemon:
    profile = ProfileConfig(
        name="cpu",
        weights=WeightsConfig("http://files/m.gguf", "a" * 64, 1000),
        min_replicas=1,
        context=512,
        parallel=2,
    )
    catalog = Catalog([ModelConfig("m", [profile])], [EngineConfig()])
    inventory, replicas = Inventory(), ReplicaSet()
    # Heartbeats far apart: the scripted nodes stay quiet, and fake time must not call them dead.
    config = AgentsConfig(listen="x:1", heartbeat_interval=100, unreachable_after=1000, lost_after=2000)
    events = NodeEvents()
    agents = AgentService(
        inventory, config=config, token_digests={token_digest(JOIN_TOKEN)}, engines=list, events=events
    )
    reconciler = Reconciler(
        catalog,
        inventory,
        Liveness(1000, 2000),
        agents,
        replicas,
        secret=b"s" * 32,
        claims={"m:cpu": Claim(1000)},
        config=ReconcilerConfig(interval=0.2),
        events=events,
    )
    lease = MemoryLease(row)
    keeper = LeaseKeeper(lease, holder=f"{name}:1:abcd", address=f"ws://{name}/agent/v1", ttl=TTL, renew_interval=RENEW)
    leadership = Leadership(keeper, agents, reconciler, inventory, settle=settle, memory=memory)
    return Daemon(name, lease, leadership, agents, reconciler, replicas)


class FakeSocket:
    """A node's WebSocket as the agent service sees it, in memory."""

    def __init__(self) -> None:
        self.to_control, self._from_node = trio.open_memory_channel[str](100)
        self._to_node, self.from_control = trio.open_memory_channel[str](100)
        self.closed = trio.Event()

    async def receive(self) -> str:
        return await self._from_node.receive()

    async def send(self, data: str) -> None:
        await self._to_node.send(data)

    async def close(self, code: int, reason: str = "") -> None:
        self.closed.set()

    async def frame(self, kind: str | None = None) -> dict[str, Any]:
        """The next frame (of ``kind``, skipping heartbeats)."""
        with trio.fail_after(30):
            while True:
                value: dict[str, Any] = json.loads(await self.from_control.receive())
                if value["type"] != "heartbeat" and (kind is None or value["type"] == kind):
                    return value

    def frames_so_far(self) -> list[dict[str, Any]]:
        """Every frame queued now, heartbeats left out."""
        frames: list[dict[str, Any]] = []
        while True:
            try:
                frame = json.loads(self.from_control.receive_nowait())
            except trio.WouldBlock:
                return frames
            if frame["type"] != "heartbeat":
                frames.append(frame)


def hello(node_id: str, replicas: list[ReplicaState] | None = None) -> str:
    facts = attrs.evolve(unprobed(), probed=True, hostname=node_id, ram_total_mib=16000)
    return encode(
        Hello(
            PROTOCOL_VERSION,
            node_id,
            JOIN_TOKEN,
            facts,
            [EngineState("llama.cpp", "b11312", "installed")],
            replicas or [],
        )
    )


async def connect(
    nursery: trio.Nursery, daemon: Daemon, node_id: str, replicas: list[ReplicaState] | None = None
) -> FakeSocket:
    socket = FakeSocket()
    nursery.start_soon(daemon.agents.serve, socket, "10.0.0.9")
    await socket.to_control.send(hello(node_id, replicas))
    return socket


async def one_leader_at_a_time(daemons: list[Daemon]) -> None:
    """Fails the test the moment two daemons accept nodes or place at once."""
    while True:
        acting = [d.name for d in daemons if d.agents.role.leader or d.leadership._lead_scope is not None]
        assert len(acting) <= 1, f"two daemons act as leader: {acting}"
        await trio.sleep(0.01)


# --------------------------------------------------------------------------- the tests


async def test_a_takeover_moves_nodes_adopts_engines_and_fences_commands(autojump_clock: Any) -> None:
    row = LeaseRow()
    a, b = make_daemon(row, "a"), make_daemon(row, "b")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(one_leader_at_a_time, [a, b])
        assert (await nursery.start(a.leadership.run)).epoch == 1
        assert not (await nursery.start(b.leadership.run)).leader

        # The standby sends nodes to the leader and places nothing.
        refused = await (await connect(nursery, b, "n1")).frame()
        assert refused == {
            "type": "refuse",
            "reason": "standby, leader is ws://a/agent/v1",
            "leader": "ws://a/agent/v1",
        }

        # The leader welcomes the node; its commands carry the lease epoch.
        node = await connect(nursery, a, "n1")
        assert (await node.frame())["type"] == "welcome"
        assert (await node.frame("set_engines"))["fencing_token"] == 1
        start = await node.frame("start_shard")  # min_replicas = 1
        assert start["fencing_token"] == 1
        replica_id, port = start["shard"]["shard_id"], start["shard"]["port"]
        assert b.reconciler.passes == 0

        # a's database connection freezes: it steps down before its lease can lapse under it.
        a.lease.hang = True
        expires = row.expires
        with trio.fail_after(TTL):
            await a.leadership.keeper.wait_change(a.leadership.role)
        assert trio.current_time() < expires
        with trio.fail_after(1):
            await node.closed.wait()  # the node is sent away at once
        assert a.agents.sessions == {} and a.reconciler.records == {} and len(a.replicas) == 0
        passes = a.reconciler.passes
        refused = await (await connect(nursery, a, "n2")).frame()
        assert refused["type"] == "refuse" and refused["reason"].startswith("standby, leader is")

        # b takes over once the lease has lapsed, with a larger epoch.
        role = await b.leadership.keeper.wait_leader()
        assert role.epoch == 2 and trio.current_time() <= expires + RENEW + 0.1

        # The node comes back to b reporting the engine a started: adopted and served at once,
        # and nothing new is placed, during the settle time or after it.
        node = await connect(nursery, b, "n1", [ReplicaState(replica_id, "ready", port=port)])
        assert (await node.frame())["type"] == "welcome"
        assert (await node.frame("set_engines"))["fencing_token"] == 2
        await trio.sleep(0.05)
        (replica,) = b.replicas.for_model("m:cpu")
        assert replica.id == replica_id and replica.url == f"http://10.0.0.9:{port}"
        await trio.sleep(SETTLE + 1)
        assert [f["type"] for f in node.frames_so_far()] == []
        assert b.reconciler.passes > 0 and a.reconciler.passes == passes

        # a's database comes back: it stays a standby and now names b to nodes.
        a.lease.hang = False
        await trio.sleep(RENEW * 3)
        assert not a.leadership.role.leader
        refused = await (await connect(nursery, a, "n3")).frame()
        assert refused["leader"] == "ws://b/agent/v1"
        nursery.cancel_scope.cancel()


async def test_after_earlier_terms_a_new_leader_settles_before_placing(autojump_clock: Any) -> None:
    """The settle hold applies after a takeover only: the first term of a database places at once."""
    row = LeaseRow(epoch=4)  # earlier terms happened: engines may be running somewhere
    a = make_daemon(row, "a")
    async with trio.open_nursery() as nursery:
        assert (await nursery.start(a.leadership.run)).epoch == 5
        node = await connect(nursery, a, "n1")
        await node.frame("set_engines")
        started = trio.current_time()
        await node.frame("start_shard")
        assert trio.current_time() - started >= SETTLE - 0.01
        nursery.cancel_scope.cancel()


async def test_a_new_leader_places_as_soon_as_every_node_that_held_replicas_has_reported(
    autojump_clock: Any,
) -> None:
    """The demo's restart: control comes back, its one node reconnects at once without the engine
    (stopped with the old control), and the first request waited the whole settle (15 s) for a
    start. Knowing from the store that n1 held replicas, the hold ends with n1's hello."""
    row, memory = LeaseRow(), MemoryHolders()
    a = make_daemon(row, "a", memory=memory)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.leadership.run)
        node = await connect(nursery, a, "n1")
        await node.frame("start_shard")
        await trio.sleep(3)  # the leader writes down who holds replicas
        assert memory.held is not None and memory.held.nodes == {"n1"} and memory.held.epoch == 1
        await a.leadership.give_up()
        await node.closed.wait()
        nursery.cancel_scope.cancel()
    b = make_daemon(row, "b", settle=15.0, memory=memory)
    async with trio.open_nursery() as nursery:
        assert (await nursery.start(b.leadership.run)).epoch == 2
        await trio.sleep(0.5)
        node = await connect(nursery, b, "n1")  # no replicas: the node lost its engine meanwhile
        joined = trio.current_time()
        await node.frame("start_shard")
        assert trio.current_time() - joined < 2  # not the 15 s hold
        nursery.cancel_scope.cancel()


async def test_without_a_record_of_holders_the_hold_lasts_its_full_time(autojump_clock: Any) -> None:
    row, memory = LeaseRow(epoch=4), MemoryHolders()
    a = make_daemon(row, "a", settle=15.0, memory=memory)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.leadership.run)
        node = await connect(nursery, a, "n1")
        started = trio.current_time()
        await node.frame("start_shard")
        assert trio.current_time() - started >= 15 - 0.01
        nursery.cancel_scope.cancel()


async def test_cancelling_the_daemon_steps_down_without_releasing(autojump_clock: Any) -> None:
    row = LeaseRow()
    a = make_daemon(row, "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.leadership.run)
        node = await connect(nursery, a, "n1")
        await node.frame("start_shard")
        await a.leadership.give_up()
        assert not a.agents.role.leader and row.holder is None  # released: a standby may take it now
        await node.closed.wait()
        nursery.cancel_scope.cancel()


async def test_a_standby_answers_503_naming_the_leader(autojump_clock: Any) -> None:
    row = LeaseRow()
    a, b = make_daemon(row, "a"), make_daemon(row, "b")

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"served"})

    async def call(daemon: Daemon, path: str) -> tuple[int, dict[bytes, bytes], bytes]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await StandbyGate(inner, daemon.leadership)({"type": "http", "path": path, "method": "GET"}, None, send)
        return sent[0]["status"], dict(sent[0]["headers"]), sent[1]["body"]

    async with trio.open_nursery() as nursery:
        await nursery.start(a.leadership.run)
        await nursery.start(b.leadership.run)
        assert await call(a, "/v1/chat/completions") == (200, {}, b"served")
        status, headers, body = await call(b, "/v1/chat/completions")
        assert status == 503 and headers[b"x-llmgw-leader"] == b"ws://a/agent/v1"
        assert headers[b"retry-after"] == b"1"
        error = json.loads(body)["error"]
        assert error["code"] == "standby" and error["type"] == "service_unavailable"
        assert "the leader is ws://a/agent/v1" in error["message"]
        status, _, body = await call(b, "/healthz")
        assert status == 503 and json.loads(body) == {"status": "standby", "leader": "ws://a/agent/v1"}
        nursery.cancel_scope.cancel()


async def test_with_default_intervals_a_standby_polls_often_enough_for_prompt_takeovers(autojump_clock: Any) -> None:
    """TTL 10 s / renew 3 s: a released lease is taken within a second, a lapsed one within TTL + 1 s."""
    row = LeaseRow()
    a, b, c = (LeaseKeeper(MemoryLease(row), holder=name, address=f"ws://{name}/agent/v1") for name in "abc")
    b_scope = trio.CancelScope()

    async def run_b(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        with b_scope:
            await b.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(run_b)
        assert a.role.leader and not b.role.leader
        await trio.sleep(7)  # a few renews in
        await a.give_up()  # SIGTERM on the leader
        released = trio.current_time()
        await b.wait_leader()
        assert trio.current_time() - released < 1.0
        await nursery.start(c.run)
        await trio.sleep(4)
        b_scope.cancel()  # kill -9: no release, the lease lapses on its own
        expires = row.expires
        await c.wait_leader()
        assert trio.current_time() - expires < 1.0
        nursery.cancel_scope.cancel()


async def test_on_sqlite_a_restarted_daemon_leads_at_once(tmp_path: Path) -> None:
    """A crashed run's lease would otherwise keep its successor waiting for the TTL."""
    async with await connect_store(tmp_path / "s.db") as store:
        assert await store.lease.try_acquire("host:1:dead", "ws://old/agent/v1", 60) is not None
        await clear_single_daemon_lease(store.lease)
        grant = await store.lease.try_acquire("host:2:beef", "ws://new/agent/v1", 60)
        assert grant is not None and grant.epoch == 2  # a new term: nodes accept its commands


# --------------------------------------------------------------------------- configuration


def test_leadership_config_is_checked() -> None:
    pg = "postgresql://llmgw@db/llmgw"
    agents = AgentsConfig(listen="0.0.0.0:8090")
    with pytest.raises(ConfigError, match=r"leadership\.advertise is required with a PostgreSQL store"):
        validate(ControlConfig(store=pg, agents=agents))
    for bad in ("http://10.0.0.2:8090/agent/v1", "ws://0.0.0.0:8090/agent/v1", "ws://h:99999/agent/v1"):
        with pytest.raises(ConfigError, match=r"leadership\.advertise"):
            validate(ControlConfig(store=pg, agents=agents, leadership=LeadershipConfig(advertise=bad)))
    with pytest.raises(ConfigError, match="renew_interval"):
        validate(ControlConfig(leadership=LeadershipConfig(ttl=2, renew_interval=1.8)))
    with pytest.raises(ConfigError, match="settle"):
        validate(ControlConfig(leadership=LeadershipConfig(settle=-1)))
    ok = LeadershipConfig(ttl=2, renew_interval=0.5, advertise="wss://c1.example:8090/agent/v1")
    assert validate(ControlConfig(store=pg, agents=agents, leadership=ok)).leadership == ok


# --------------------------------------------------------------------------- cluster secrets


# pg_server comes from tests/conftest.py.


async def test_daemons_sharing_postgresql_agree_on_secrets(pg_server: PostgresServer, tmp_path: Path) -> None:
    url = pg_server.create_database(f"secrets_{os.getpid()}")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    # The first daemon had a secret file from its single-daemon days: it becomes the cluster's,
    # so the key digests it made stay valid.
    (one / "key-secret").write_text("ab" * 32 + "\n")
    stores = [await connect_store(url), await connect_store(url)]
    try:
        first = await cluster_secret(stores[0], "key-digest", one / "key-secret")
        assert first == bytes.fromhex("ab" * 32)
        assert await cluster_secret(stores[1], "key-digest", two / "key-secret") == first
        # Two daemons starting at once, each with its own file: one offer wins, both get it.
        (two / "control.secret").write_text("cd" * 32)
        (one / "control.secret").write_text("ef" * 32)
        got: dict[str, bytes] = {}
        async with trio.open_nursery() as nursery:
            for name, store, data in (("one", stores[0], one), ("two", stores[1], two)):

                async def get(name: str = name, store: Any = store, data: Path = data) -> None:
                    got[name] = await cluster_secret(store, "shard-api-keys", data / "control.secret")

                nursery.start_soon(get)
        assert got["one"] == got["two"] and got["one"] in (bytes.fromhex("cd" * 32), bytes.fromhex("ef" * 32))
        # Without any file both still agree, on a fresh random value, and no file is written.
        other = [await cluster_secret(s, "other", tmp_path / "none") for s in stores]
        assert other[0] == other[1] and len(other[0]) == 32 and other[0] not in (first, got["one"])
        assert not (tmp_path / "none").exists()
    finally:
        for store in stores:
            await store.aclose()


async def test_a_serving_standby_lets_client_traffic_through_and_says_so_in_its_health(autojump_clock: Any) -> None:
    row = LeaseRow()
    a, b = make_daemon(row, "a"), make_daemon(row, "b")

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"served"})

    async def call(daemon: Daemon, path: str) -> tuple[int, bytes]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        gate = StandbyGate(inner, daemon.leadership, serves=True)
        await gate({"type": "http", "path": path, "method": "GET"}, None, send)
        return sent[0]["status"], sent[1]["body"]

    async with trio.open_nursery() as nursery:
        await nursery.start(a.leadership.run)
        await nursery.start(b.leadership.run)
        assert not b.leadership.role.leader
        assert await call(b, "/v1/chat/completions") == (200, b"served")
        status, body = await call(b, "/healthz")
        assert status == 200
        assert json.loads(body) == {"status": "ok", "role": "standby", "leader": "ws://a/agent/v1"}
        nursery.cancel_scope.cancel()
