"""Holding requests for a model that is configured but not running, until a replica is ready.

A request for such a model waits in a bounded queue (per model) for a bounded time while the
reconciler is asked to place a replica; it is served the moment one is published. When the wait
runs out the client gets a 503 that says what blocked: no node fits, the engine is still
installing (in the node's own words), or the start failed and why.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from .errors import ApiError, standby
from .replicas import ReplicaSet


@attrs.frozen
class ActivatorConfig:
    # Requests that may wait per model; more get a 503 at once.
    queue_size: int = 100
    # Seconds a request waits for a replica before the 503.
    max_wait: float = 120.0


class Activator:
    def __init__(
        self,
        replicas: ReplicaSet,
        config: ActivatorConfig,
        *,
        waiting: dict[str, int],
        wake: Callable[[], None],
        status: Callable[[str], str],
    ) -> None:
        self.replicas = replicas
        self.config = config
        # Shared with the reconciler: how many requests wait per profile key is demand.
        self.waiting = waiting
        self._wake = wake
        self._status = status
        self._published: dict[str, trio.Event] = {}
        # Set while this daemon is a standby (the leader's agent address, or ""); None: leading.
        self._standby: str | None = None
        replicas.on_publish = self._on_publish

    def _on_publish(self, key: str) -> None:
        event = self._published.pop(key, None)
        if event is not None:
            event.set()

    def stand_down(self, leader_address: str) -> None:
        """This daemon stopped leading: the replica its waiters wait for will never be started here.

        They would otherwise wait out ``max_wait``; they get the standby's 503 naming the leader
        now, which a client retrying through a load balancer turns into a request to the leader.
        """
        self._standby = leader_address
        published, self._published = self._published, {}
        for event in published.values():
            event.set()

    def lead(self) -> None:
        self._standby = None

    def queue_depth(self) -> int:
        return sum(self.waiting.values())

    async def wait_ready(self, key: str) -> None:
        if self.replicas.for_model(key):
            return
        if self._standby is not None:
            raise standby(self._standby)
        if self.waiting.get(key, 0) >= self.config.queue_size:
            raise ApiError(503, f"Model '{key}' is starting and {self.config.queue_size} requests already wait "
                                "for it; retry shortly.", code="model_queue_full", headers=(("retry-after", "5"),))
        self.waiting[key] = self.waiting.get(key, 0) + 1
        self._wake()
        try:
            with trio.move_on_after(self.config.max_wait):
                while not self.replicas.for_model(key):
                    await self._published.setdefault(key, trio.Event()).wait()
                    if self._standby is not None:
                        raise standby(self._standby)
                return
        finally:
            self.waiting[key] -= 1
            if not self.waiting[key]:
                del self.waiting[key]
        raise ApiError(503, f"Model '{key}' has no ready replica after {self.config.max_wait:g} s: "
                            f"{self._status(key)}.", code="model_not_ready", headers=(("retry-after", "10"),))
