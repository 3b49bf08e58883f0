"""A hung engine found by its progress, withdrawn from routing, its waiting requests moved.

An engine can stop answering while its process and port stay up (a driver hang, a stuck kernel,
a deadlocked slot; SIGSTOP reproduces it): requests on it would wait out their first-byte or idle
deadline (minutes), and its node sees a live process. Time alone cannot tell that from a slow
engine -- a 30k-token prompt on a CPU, a long reasoning pause -- so two signs are needed:

* no progress: requests wait on the replica's engine and no byte of any answer came from it for
  ``router.hang_suspect_after`` seconds (``Progress``, fed by the relay: every response head and
  body chunk is progress);
* no life: then its ``GET /health`` is asked, with a deadline of ``router.hang_probe_timeout``.
  llama-server answers /health from its HTTP threads whatever its slots are doing, so a slow engine
  answers at once; a stopped or deadlocked one answers nothing (a timeout, a refused or reset
  connection).

Both, and the replica is hung: it is withdrawn from routing (like a cooldown that lasts until its
/health answers 200 again, ``cooldown_until`` at infinity, never chosen even as a last resort), and
every scope waiting on it is cancelled, so a request still waiting for its first byte is moved to
another replica at once (``Retry``, nothing reached the client) and a started stream is continued
elsewhere as after an engine death (``Broken``). A hung replica's /health is asked every
``router.hung_probe_every`` seconds; a 200 re-admits it. An engine that stays hung is restarted by
its node (llmgw_node/src/llmgw_node/supervisor.py, after its own failed health probes).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from llmgw_shared.logs import get_logger

from .config import GatewayConfig
from .metrics import GatewayMetrics
from .replicas import Replica, ReplicaSet
from .upstream import UpstreamClient, UpstreamError

log = get_logger(__name__)

# Probes in flight at once across replicas: each is one small GET, bounded by its deadline; 16 asks
# a fleet's worth in one round without letting a storm of suspicions open hundreds of connections.
PROBE_CONCURRENCY = 16
# A probe's answer body is read only to free the connection; /health's is a few bytes.
_PROBE_BODY_LIMIT = 4096


class HangWatch:
    """The gateway's one watcher of every replica's progress (``run``, a task for the daemon's life)."""

    def __init__(
        self,
        replicas: ReplicaSet,
        upstream: UpstreamClient,
        config: GatewayConfig,
        metrics: GatewayMetrics,
    ) -> None:
        self.replicas = replicas
        self.upstream = upstream
        self.config = config
        self.metrics = metrics
        self._probes = trio.CapacityLimiter(PROBE_CONCURRENCY)
        # Read at scrape time: replicas withdrawn by the control plane leave the count with them.
        metrics.hung_replicas.set_function(lambda: sum(1 for r in self.replicas if r.progress.hung_since is not None))

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                self.check(nursery.start_soon)
                await trio.sleep(self.config.hang_check_every)

    def check(self, start: Callable[..., object]) -> None:
        """Start a probe of every replica that is suspect now, or hung and due to be asked again."""
        now = trio.current_time()
        for replica in self.replicas:
            progress = replica.progress
            if progress.suspect(now, self.config.hang_suspect_after):
                progress.probing = True
                start(self._suspect, replica)
            elif progress.hung_since is not None and not progress.probing and now >= progress.next_probe:
                progress.probing = True
                start(self._hung, replica)

    async def _suspect(self, replica: Replica) -> None:
        progress = replica.progress
        try:
            status = await self.probe(replica)
        finally:
            progress.probing = False
        if status is not None:
            # Alive (slow, or busy with a long prompt): silence is counted afresh from here.
            progress.last = trio.current_time()
        elif progress.waiting and replica is self.replicas.get(replica.id):
            self.withdraw(replica)

    async def _hung(self, replica: Replica) -> None:
        progress = replica.progress
        try:
            status = await self.probe(replica)
        finally:
            progress.probing = False
            progress.next_probe = trio.current_time() + self.config.hung_probe_every
        if status == 200 and progress.hung_since is not None:
            self.readmit(replica)

    def withdraw(self, replica: Replica) -> None:
        progress = replica.progress
        now = trio.current_time()
        progress.hung_since = now
        progress.next_probe = now + self.config.hung_probe_every
        replica.cooldown_until = math.inf
        self.metrics.hangs.labels(replica.id).inc()
        waiting = list(progress.waiting)
        log.warning(
            "replica %s is hung: requests waited %.1f s without a byte and its /health did not answer "
            "within %g s; withdrawn from routing, %d waiting request(s) moved",
            replica.id,
            now - progress.last,
            self.config.hang_probe_timeout,
            len(waiting),
            extra={"replica": replica.id},
        )
        for scope in waiting:
            scope.cancel()

    def readmit(self, replica: Replica) -> None:
        progress = replica.progress
        hung_for = trio.current_time() - (progress.hung_since or 0.0)
        progress.hung_since = None
        progress.last = trio.current_time()
        replica.cooldown_until = 0.0
        log.warning(
            "replica %s answers /health again after %.1f s hung; back in rotation",
            replica.id,
            hung_for,
            extra={"replica": replica.id},
        )
        # Requests queued for a slot may take its slots now.
        self.replicas.slots_opened(replica)

    async def probe(self, replica: Replica) -> int | None:
        """The status its engine's /health answers within the deadline; None: no answer."""
        headers = [("authorization", f"Bearer {replica.api_key}")] if replica.api_key else []
        timeout = self.config.hang_probe_timeout
        async with self._probes:
            with trio.move_on_after(timeout):
                try:
                    async with self.upstream.open(
                        "GET", replica.url + "/health", headers=headers, body=b"", connect_timeout=timeout
                    ) as response:
                        size = 0
                        while size < _PROBE_BODY_LIMIT and (chunk := await response.next_chunk()) is not None:
                            size += len(chunk)
                        return response.status_code
                except UpstreamError:
                    return None
        return None
