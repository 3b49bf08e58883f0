"""Where a capacity run gets its replica: the fleet's (``capacity_runs.ReplicaSource``).

- A ready replica of the profile (on the node asked for, if one was) is used as it is.
- Otherwise, with no node asked for, the run waits in the activator's queue like a request: that
  is the demand that makes the reconciler place a replica, and the wait ends when one is ready
  (bounded by the activator's ``max_wait``). The slot it is handed is given back at once: the
  run's requests go straight to the replica, not through the gateway's slots.
- With a node asked for and no replica there, the reconciler starts one on that node
  (``Reconciler.start_on``: the pure ``plan`` decides whether it fits), and the run waits for it
  to be published, bounded by the profile's ``start_timeout``.

A replica the run started is drained after it (``Reconciler.give_back_started``) unless requests
came to it meanwhile or ``min_replicas`` needs it. While a run measures a replica, the replica
counts as busy (never evicted), and each finished request marks it used (no idle stop).
"""

from __future__ import annotations

from typing import Any

import trio

from ..catalog import Resolved
from ..gateway.activator import Activator, Refusal
from ..gateway.replicas import Replica
from .capacity import hardware_of
from .capacity_runs import Acquired, RunFailed, comparable_facts
from .capacity_sweep import SweepTarget
from .inventory import Inventory
from .lifecycle import TERMINAL
from .reconciler import Reconciler

# Seconds beyond the profile's start_timeout a run waits for the replica it started: the node
# reports the failure itself within start_timeout, this only covers a node that went silent.
START_MARGIN = 30.0
# Seconds between looks at whether the started replica is published (a start takes seconds).
POLL_INTERVAL = 0.25


class FleetReplicas:
    def __init__(self, reconciler: Reconciler, activator: Activator, inventory: Inventory) -> None:
        self.reconciler = reconciler
        self.activator = activator
        self.inventory = inventory

    def has_node(self, node_id: str) -> bool:
        return self.inventory.get(node_id) is not None

    def _acquired(self, replica: Replica, resolved: Resolved, started: bool) -> Acquired:
        record = self.reconciler.records.get(replica.id)
        self.reconciler.benchmarking.add(replica.id)
        target = SweepTarget(replica.url, replica.api_key, replica.served_name or resolved.model.name)
        return Acquired(target, replica.id, record.node_id if record is not None else "", started)

    def _ready(self, profile_key: str, node: str | None) -> Replica | None:
        ready = [
            r
            for r in self.reconciler.replicas.for_model(profile_key)
            if node is None
            or (self.reconciler.records.get(r.id) is not None and self.reconciler.records[r.id].node_id == node)
        ]
        return min(ready, key=lambda r: (r.in_flight, r.id), default=None)

    async def acquire(self, resolved: Resolved, node: str | None) -> Acquired:
        profile_key = resolved.profile_key
        existing = self._ready(profile_key, node)
        if existing is not None:
            return self._acquired(existing, resolved, started=False)
        if node is None:
            # One already starting (for requests, or min_replicas) is not the run's to stop after.
            starting = any(
                r.profile_key == profile_key and not r.draining and r.status not in TERMINAL
                for r in self.reconciler.records.values()
            )
            result = await self.activator.wait(profile_key)
            if isinstance(result, Refusal):
                if result is Refusal.OVERFLOW:
                    raise RunFailed(f"{profile_key} has requests queued beyond its queue: try when it is less busy")
                if result is Refusal.STANDBY:
                    # Only the leader starts and measures replicas.
                    raise RunFailed("this control daemon is not (or no longer) the leader: start the run on the leader")
                raise RunFailed(self.activator.refusal_error(result, profile_key).message)
            replica = result.replica
            result.give_back()
            return self._acquired(replica, resolved, started=not starting)
        try:
            replica_id = self.reconciler.start_on(profile_key, node)
        except ValueError as exc:
            raise RunFailed(f"no replica of {profile_key} on node {node}, and none can start there: {exc}") from None
        self.reconciler.benchmarking.add(replica_id)
        with trio.move_on_after(resolved.profile.start_timeout + START_MARGIN):
            while True:
                published = self.reconciler.replicas.get(replica_id)
                if published is not None:
                    return self._acquired(published, resolved, started=True)
                record = self.reconciler.records.get(replica_id)
                if record is None or record.status in TERMINAL:
                    detail = f": {record.detail}" if record is not None and record.detail else ""
                    self.reconciler.benchmarking.discard(replica_id)
                    raise RunFailed(f"the replica started for the run on node {node} did not start{detail}")
                await trio.sleep(POLL_INTERVAL)
        self.reconciler.benchmarking.discard(replica_id)
        self.reconciler.give_back_started(replica_id)
        raise RunFailed(f"the replica started for the run on node {node} was not ready in time")

    def give_back(self, acquired: Acquired) -> None:
        if acquired.started:
            self.reconciler.give_back_started(acquired.replica_id)
        self.reconciler.benchmarking.discard(acquired.replica_id)

    def touch(self, acquired: Acquired) -> None:
        replica = self.reconciler.replicas.get(acquired.replica_id)
        if replica is not None:
            replica.last_used = trio.current_time()

    def comparable(self, resolved: Resolved, node_id: str) -> dict[str, Any]:
        node = self.inventory.get(node_id)
        if node is None:
            raise RunFailed(f"node {node_id} went away")
        profile = resolved.profile
        version = self.reconciler.catalog.engine_version(profile)
        engine = node.engine(profile.engine, version)
        reported = engine.reported_version if engine is not None else ""
        return comparable_facts(resolved, version, reported, node.facts, hardware_of(node.facts))
