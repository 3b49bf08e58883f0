"""Commands that arrive: the agent service's writer against a scripted socket, in fake time.

Every command the reconciler queued is either written to the node's socket or reported as not
sent, wherever the connection is cut; the heartbeat timer never cuts a send; and a node that
leaves a command unacknowledged has its start failed with the reason and is reconnected.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio

from llmgw_control.fleet.agents import AgentsConfig, AgentService, token_digest
from llmgw_control.fleet.events import NodeEvents
from llmgw_control.fleet.inventory import Inventory
from llmgw_shared.facts import unprobed
from llmgw_shared.wire import (
    PROTOCOL_VERSION,
    Ack,
    Command,
    DrainReplica,
    EngineState,
    Hello,
    ReplicaSpec,
    StartReplica,
    StopReplica,
    WeightsSpec,
    encode,
)
from support.waiting import wait_until

HEARTBEAT = 0.1

# The fleet is closed by default (issue 13): the scripted node presents a shared join token.
TOKEN = "llmgw-join-test-token"


def start(n: int) -> StartReplica:
    spec = ReplicaSpec(
        f"m-cpu-{n:08x}-{'0' * 16}",
        "llama.cpp",
        "b11312",
        WeightsSpec("http://f/m.gguf", "a" * 64, 1),
        20000 + n,
        api_key="k",
    )
    return StartReplica(f"c{n}", 1, spec)


COMMANDS: list[Command] = [
    start(1),
    StopReplica("c2", 1, "x"),
    start(3),
    DrainReplica("c4", 1, "y"),
    start(5),
    start(6),
    StopReplica("c7", 1, "z"),
]


class ScriptedSocket:
    """A node's socket: every send takes ``send_time``; the ``cut_at``-th send ends the session
    while it is in progress ("during") or just after it completed ("after")."""

    def __init__(self, service: AgentService, *, send_time: float = 0.01, cut_at: int = 0, when: str = "") -> None:
        self.service = service
        self.send_time = send_time
        self.cut_at, self.when = cut_at, when
        self.calls = 0
        self.written: list[dict[str, Any]] = []
        self.to_control, self._from_node = trio.open_memory_channel[str](100)

    def _cut(self) -> None:
        session = self.service.sessions.get("n1")
        assert session is not None
        session.cancel_scope.cancel()

    async def receive(self) -> str:
        return await self._from_node.receive()

    async def send(self, data: str) -> None:
        self.calls += 1
        if self.calls == self.cut_at and self.when == "during":
            self._cut()
        await trio.sleep(self.send_time)  # the await point a cut lands on
        self.written.append(json.loads(data))
        if self.calls == self.cut_at and self.when == "after":
            self._cut()  # lands on the writer's next await: its wait for a command, or a send

    async def close(self, code: int, reason: str = "") -> None:
        pass


def hello() -> str:
    facts = attrs.evolve(unprobed(), probed=True, hostname="n1", ram_total_mib=4096)
    return encode(Hello(PROTOCOL_VERSION, "n1", TOKEN, facts, [EngineState("llama.cpp", "b11312", "installed")], []))


@attrs.define
class Run:
    accepted: list[Command]
    written: list[str]
    unsent: list[str]
    failed: list[tuple[str, str]]
    sends: int


class Told:
    """Listens as the reconciler does: the ids of the commands that failed (with why) or never left."""

    fencing_token = 1

    def __init__(self, failed: list[tuple[str, str]], unsent: list[str]) -> None:
        self.failed, self.unsent = failed, unsent

    def wake(self) -> None:
        pass

    def command_failed(self, node_id: str, command: Command, reason: str) -> None:
        self.failed.append((command.id, reason))

    def command_unsent(self, node_id: str, command: Command) -> None:
        self.unsent.append(command.id)


async def run(
    *,
    cut_at: int = 0,
    when: str = "",
    send_time: float = 0.01,
    ack: bool = True,
    ack_timeout: float = 30.0,
    until: float = 5.0,
) -> Run:
    unsent: list[str] = []
    failed: list[tuple[str, str]] = []
    config = AgentsConfig(
        listen="x:1", heartbeat_interval=HEARTBEAT, unreachable_after=1000, lost_after=2000, ack_timeout=ack_timeout
    )
    events = NodeEvents()
    events.listen(Told(failed, unsent))
    service = AgentService(Inventory(), config=config, token_digests={token_digest(TOKEN)}, engines=list, events=events)
    socket = ScriptedSocket(service, send_time=send_time, cut_at=cut_at, when=when)
    accepted: list[Command] = []

    async def reconciler() -> None:
        await wait_until(lambda: "n1" in service.sessions, timeout=30, interval=0.001)
        # Some commands queued at once, the rest spread over heartbeats.
        for index, command in enumerate(COMMANDS):
            if service.send("n1", command):
                accepted.append(command)
            if index >= 2:
                await trio.sleep(HEARTBEAT * 1.5)

    async def node() -> None:
        await socket.to_control.send(hello())
        acked: set[str] = set()
        while ack:
            for frame in socket.written:
                if "id" in frame and frame["type"] != "set_engines" and frame["id"] not in acked:
                    acked.add(frame["id"])
                    await socket.to_control.send(encode(Ack(frame["id"], True)))
                elif frame["type"] == "heartbeat":
                    pass
            await socket.to_control.send('{"type": "heartbeat", "seq": 1}')  # keeps it alive
            await trio.sleep(HEARTBEAT / 2)

    with trio.move_on_after(until):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node)
            nursery.start_soon(reconciler)
            await service.serve(socket, "10.0.0.1")
            nursery.cancel_scope.cancel()
    written = [f["id"] for f in socket.written if f["type"] in ("start_shard", "stop_shard", "drain_shard")]
    return Run(accepted, written, unsent, failed, socket.calls)


async def test_a_cut_at_any_await_point_of_the_writer_loses_no_command(autojump_clock: Any) -> None:
    whole = await run()
    assert whole.written == [c.id for c in COMMANDS] and whole.unsent == []
    # Every send the writer makes (welcome, set_engines, commands, heartbeats), cut during it or
    # right after it (so the cut lands on the next await: the wait for a command or a send).
    for cut_at in range(1, whole.sends + 1):
        for when in ("during", "after"):
            result = await run(cut_at=cut_at, when=when)
            for command in result.accepted:
                delivered, reported = command.id in result.written, command.id in result.unsent
                assert delivered != reported, (cut_at, when, command.id, result)


async def test_the_heartbeat_timer_never_cuts_a_command_being_sent(autojump_clock: Any) -> None:
    """Sends slower than the heartbeat interval: before the fix ``move_on_at(next_beat)`` cancelled
    each command's send after it had been taken from the queue, and the command was gone."""
    result = await run(send_time=HEARTBEAT * 3, until=20)
    assert result.written == [c.id for c in COMMANDS]
    assert result.unsent == []


async def test_a_command_left_unacknowledged_fails_the_start_and_reconnects_the_node(autojump_clock: Any) -> None:
    started = trio.current_time()
    result = await run(ack=False, ack_timeout=3.0, until=60)
    assert trio.current_time() - started < 10  # the connection was closed, not left hanging
    reasons = dict(result.failed)
    assert reasons["c1"] == "node n1 did not acknowledge start_shard within 3 s"
    assert set(reasons) <= {c.id for c in COMMANDS}
