"""Leadership in the control daemon: who may manage the fleet, and what a standby does instead.

A ``LeaseKeeper`` over the store's lease publishes this daemon's role. ``Leadership`` turns every
change into action at once, in the keeper's own task (synchronously, before the lease can lapse):

* **leader** — the agent service accepts nodes, commands carry the lease epoch as their fencing
  token, and the reconciler runs. For ``settle`` seconds after taking over it only absorbs node
  reports (adopting the engines they run) and serves ready replicas, without starting or stopping
  any: nodes need a moment to find the new leader, and placing before they report would start
  duplicates of engines that are still running. The leader writes down in the store which nodes
  hold replicas (when that changes); the next one ends its hold as soon as every one of those
  has said hello, instead of always waiting ``settle`` out (a restart of one control daemon on
  a small fleet: about a second instead of 15).
* **standby** (or stepping down) — the reconciler is cancelled, every agent connection is closed,
  new nodes are refused with ``standby, leader is <address>``, the replicas this daemon published
  are withdrawn, requests waiting in the activator for a model to start get the standby 503 at
  once. With ``standby_serves`` (the default) it serves client traffic from the leader's
  published view of ready replicas (fleet/view.py) and places nothing: a model with no ready
  replica gets the standby 503 naming the leader. Without it, the client API answers 503
  naming the leader (``StandbyGate``). See docs/failover.md.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Iterable
from typing import Any, Protocol

import attrs
import trio

from llmgw_shared.logs import get_logger

from ..api_errors import standby
from ..gateway.activator import Activator
from ..store import FleetHolders, Lease, LeaseKeeper, Role, StoreError
from ..transport.asgi import Receive, Scope, Send, send_json
from .agents import AgentService
from .inventory import Inventory
from .reconciler import Reconciler
from .view import ViewFollower, ViewPublisher, ViewStore

log = get_logger(__name__)


@attrs.frozen
class LeadershipConfig:
    """The leader lease (see docs/failover.md). Only one daemon leads the fleet at a time."""

    # How long a grant lasts without a renew: a killed leader is replaced after about this long.
    ttl: float = 10.0
    renew_interval: float = 3.0
    # Where nodes reach this daemon's agent listener (ws://host:port/agent/v1): a standby sends
    # nodes here when this daemon leads. Empty: derived from agents.public_url or the bound address
    # (fine for one daemon; required with a PostgreSQL store, where other machines must reach it).
    advertise: str = ""
    # After taking over from an earlier leader, this long without starting or stopping replicas,
    # so nodes can reconnect and report the engines they run (adopted, not duplicated); reports
    # are absorbed and ready replicas served meanwhile. Make it longer than the nodes' reconnect
    # delay after a takeover: a node's connect timeout (10 s) plus its backoff (docs/failover.md).
    settle: float = 15.0
    # A standby serves the OpenAI API from the leader's published replica view (only the leader
    # places); false: a standby answers every client with 503 ``standby`` naming the leader.
    standby_serves: bool = True


# How often the leader compares the nodes holding replicas with what it last wrote down: a
# write happens only on a change, so this is the delay before the store knows of one.
_HOLDERS_EVERY = 1.0
# A store that does not answer this fast is not worth waiting for: the hold falls back to its
# full length, and the next change is written on a later round.
_STORE_WAIT = 5.0


class HolderMemory(Protocol):
    """Where a leader leaves the nodes holding replicas for its successor (``Store`` is one)."""

    async def fleet_holders(self) -> FleetHolders | None: ...
    async def remember_holders(self, epoch: int, nodes: Iterable[str]) -> bool: ...


def new_holder() -> str:
    """Unique per process start: a restarted daemon must never inherit its predecessor's term."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


async def clear_single_daemon_lease(lease: Lease) -> None:
    """On SQLite there is exactly one daemon, so a holder in the row is a previous run of it.

    Releasing that stale term lets a daemon restarted after a crash lead at once instead of
    waiting out its own old lease; the next acquisition still gets a larger epoch, so nodes that
    saw the old daemon's commands accept the new one's.
    """
    info = await lease.current()
    if info.holder is not None:
        log.info("giving up the lease of a previous run (%s): a SQLite store has one daemon", info.holder)
        await lease.give_up(info.holder)


class Leadership:
    def __init__(
        self,
        keeper: LeaseKeeper,
        agents: AgentService,
        reconciler: Reconciler,
        inventory: Inventory,
        *,
        settle: float = 3.0,
        activator: Activator | None = None,
        memory: HolderMemory | None = None,
        view: ViewStore | None = None,
    ) -> None:
        self.keeper = keeper
        self.agents = agents
        self.reconciler = reconciler
        self.inventory = inventory
        self.activator = activator
        self.settle = settle
        self.memory = memory
        self._lead_scope: trio.CancelScope | None = None
        # With a view store: the leader publishes its ready replicas, a standby serves them.
        self.publisher = ViewPublisher(view, reconciler.replicas, lambda: set(reconciler.records)) if view else None
        self.follower = ViewFollower(view, reconciler.replicas, reconciler.replica_api_key) if view else None
        self._follow_scope: trio.CancelScope | None = None
        # Replicas the follower added before this daemon took over: kept routable through the
        # hold, then withdrawn unless the reconciler adopted them.
        self._inherited: set[str] = set()
        # Until the keeper has spoken, refuse nodes: two daemons starting together must not both
        # accept them.
        agents.role = Role(leader=False)
        keeper.on_change(self._on_change)

    @property
    def role(self) -> Role:
        return self.keeper.role

    def _on_change(self, role: Role) -> None:
        # Runs in the keeper's task, synchronously: when it returns this daemon has stopped acting
        # as the leader (nothing below awaits, so nothing can slip in between).
        if role.leader:
            assert role.epoch is not None
            self.reconciler.fencing_token = role.epoch
            self.agents.role = role
            if self.activator is not None:
                self.activator.lead()
            if self._follow_scope is not None:
                self._follow_scope.cancel()
            if self.follower is not None:
                self._inherited = self.follower.hand_over()
            return
        was_leading = self.agents.role.leader
        self.agents.role = role
        if self.activator is not None:
            # Requests waiting for a model to start here would wait for a start that never comes.
            self.activator.stand_down(role.leader_address or "")
        if self._lead_scope is not None:
            self._lead_scope.cancel()
        if was_leading:
            self.agents.close_all("this control daemon is no longer the leader")
            self.reconciler.stand_down()
            for node in self.inventory:
                # What a node runs is learnt again from its hello when it comes back (labels and
                # cordons stay): the old reports would be stale by then.
                node.connected = False
                node.replicas.clear()

    async def run(self, *, task_status: trio.TaskStatus[Role] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the lease and act on the role until cancelled; ``started`` after the first attempt."""
        async with trio.open_nursery() as nursery:
            role = await nursery.start(self.keeper.run)
            task_status.started(role)
            if self.follower is not None:
                nursery.start_soon(self._follow, self.follower)
            while True:
                role = await self.keeper.wait_leader()
                await self._lead(role)
                # Cancelled by the step-down callback; wait for the next term.
                await self.keeper.wait_change(role)

    async def _lead(self, role: Role) -> None:
        with trio.CancelScope() as scope:
            self._lead_scope = scope
            if self.keeper.role != role:
                return  # stepped down again before this task ran
            # Epoch 1 is the first term this database has seen: no earlier leader started engines
            # for nodes to report, so there is nothing to wait for.
            settle = self.settle if (role.epoch or 0) > 1 else 0.0
            self.reconciler.hold_until = self.reconciler.clock() + settle
            self.reconciler.awaited_nodes = None
            log.info("leading the fleet", extra={"epoch": role.epoch, "settle": settle})
            async with trio.open_nursery() as nursery:
                await nursery.start(self.reconciler.run)
                if self.memory is not None and role.epoch is not None:
                    if settle:
                        nursery.start_soon(self._await_holders, self.memory, role.epoch)
                    nursery.start_soon(self._remember_holders, self.memory, role.epoch)
                if settle:
                    await trio.sleep(settle)
                    self.reconciler.wake()  # the first pass that may place, without waiting an interval
                for replica_id in self._inherited - set(self.reconciler.records):
                    self.reconciler.replicas.withdraw(replica_id)  # the view had it; no node reported it
                self._inherited = set()
                if self.publisher is not None and role.epoch is not None:
                    nursery.start_soon(self.publisher.run, role.epoch)
        self._lead_scope = None

    async def _follow(self, follower: ViewFollower) -> None:
        """While standing by, serve the leader's view (cancelled at once on taking over)."""
        while True:
            role = self.keeper.role
            if not role.leader:
                with trio.CancelScope() as scope:
                    self._follow_scope = scope
                    await follower.run()
                self._follow_scope = None
            role = self.keeper.role
            if role.leader:
                await self.keeper.wait_change(role)

    async def _await_holders(self, memory: HolderMemory, epoch: int) -> None:
        """Tell the reconciler whom to wait for: the nodes that held replicas before this term."""
        held = None
        with trio.move_on_after(_STORE_WAIT):
            try:
                held = await memory.fleet_holders()
            except StoreError as exc:
                log.warning("cannot read which nodes held replicas (%s): holding the full settle time", exc)
        if held is None or held.epoch >= epoch:
            return
        log.info(
            "waiting for %d node(s) that held replicas to report",
            len(held.nodes),
            extra={"nodes": sorted(held.nodes)[:20], "epoch": held.epoch},
        )
        self.reconciler.awaited_nodes = held.nodes
        self.reconciler.wake()

    async def _remember_holders(self, memory: HolderMemory, epoch: int) -> None:
        """Write down which nodes hold replicas whenever that changes (never during the hold:
        the set is still being learnt then, and would hide nodes not yet back from the next leader)."""
        written: frozenset[str] | None = None
        while True:
            await trio.sleep(_HOLDERS_EVERY)
            if self.reconciler.clock() < self.reconciler.hold_until:
                continue
            nodes = self.reconciler.holders()
            if nodes == written:
                continue
            with trio.move_on_after(_STORE_WAIT):
                try:
                    if not await memory.remember_holders(epoch, nodes):
                        return  # a later leader wrote: this term is over, whether we know it yet or not
                    written = nodes
                except StoreError as exc:
                    log.warning("cannot write which nodes hold replicas (%s): retrying", exc)

    async def give_up(self) -> None:
        """On SIGTERM: step down and give the lease up, so a standby takes over on its next poll."""
        given_up = await self.keeper.give_up()
        log.info(
            "leader lease given up"
            if given_up
            else "leader lease not given up (not held, or the "
            "database did not answer): a standby takes over after the TTL"
        )


class StandbyGate:
    """In front of the client API: a standby answers 503 and names the leader.

    ``/healthz`` says ``standby`` with a 503 so a load balancer's health check moves traffic to
    the leader; the OpenAI paths get the OpenAI error shape with ``code: standby`` and
    ``Retry-After``, so a client that retries through the load balancer lands on the leader.
    """

    def __init__(self, app: Any, leadership: Leadership, *, serves: bool = False) -> None:
        self.app = app
        self.leadership = leadership
        # standby_serves: /v1 goes through (served from the leader's view); /healthz says 200.
        self.serves = serves

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        role = self.leadership.role
        if scope["type"] != "http" or role.leader:
            await self.app(scope, receive, send)
            return
        if self.serves:
            if scope["path"] == "/healthz":
                body = json.dumps({"status": "ok", "role": "standby", "leader": role.leader_address}).encode()
                await send_json(send, 200, body, [])
                return
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/healthz":
            body = json.dumps({"status": "standby", "leader": role.leader_address}).encode()
        else:
            body = standby(role.leader_address).encoded()
        headers = [(b"retry-after", b"1")]
        if role.leader_address:
            headers.append((b"x-llmgw-leader", role.leader_address.encode()))
        await send_json(send, 503, body, headers)
