"""Admission to replica slots: one bounded wait for "no replica yet" and "every slot busy".

Each replica has a number of slots (its profile's ``parallel``, or a static replica's ``slots``); a
request holds one while a replica serves it. When a replica of the model has a free slot, taking
it is a synchronous call (``try_acquire``): no event, no task, no wait. Otherwise the request
waits in the model's queue (``wait``), bounded in length and in time, and a slot that frees, or a
replica that is published, is handed straight to the next waiter -- so a request arriving later
can never take a slot ahead of one that waits. The order is interactive before batch, first come
first served within a class, and a waiting batch request is let in after at most
``batch_after`` interactive ones, so the lower class is slowed, never starved.

A slot is a guard (``Slot``, a context manager): given back exactly once, when the block that
holds it ends, whatever ends it. A slot handed to a waiter that is cancelled before it resumes
is passed on at once. The wait ends with a typed result, the slot or a ``Refusal`` (overflow,
timeout, standby, exhausted), which the gateway turns into the client's answer; the queued
requests per model are the demand (gateway/demand.py) the reconciler reads, and the reconciler is
woken when one queues.
"""

from __future__ import annotations

import contextlib
import enum
from collections import deque
from collections.abc import Callable, Collection, Iterator
from types import TracebackType

import attrs
import trio

from llmgw_shared.logs import get_logger

from ..api_errors import ClientApiError, standby
from ..priority import Priority
from .affinity import Affinity, Outcome, pick
from .balancer import choose
from .demand import WaitingRequests
from .placements import Placements
from .replicas import Replica, ReplicaSet

log = get_logger(__name__)


@attrs.frozen
class ActivatorConfig:
    # Requests that may wait per model (for a replica to start, or for a free slot); more get a
    # 429 with Retry-After at once. Bounded so a burst costs memory in proportion to this, not
    # to the burst.
    queue_size: int = 100
    # Seconds a request waits before the 503. Long enough to cover a cold start of a model
    # (download and load: the system tests' tiny model starts in seconds, a 70B model in a minute
    # or two), short of the openai client's own 600 s timeout.
    max_wait: float = 120.0
    # While both classes wait, a batch request is let in after at most this many interactive
    # ones: batch gets at least 1 in (batch_after + 1) of the slots that free. Linux's
    # mq-deadline scheduler bounds writes behind reads the same way (writes_starved, default 2).
    batch_after: int = 4


class Refusal(enum.Enum):
    """Why a wait ended without a slot."""

    # The model's queue was full: 429, retry shortly.
    OVERFLOW = "overflow"
    # max_wait passed with every slot busy, or with no replica ready: 503.
    TIMEOUT = "timeout"
    # This daemon stopped leading while the request waited: the standby's 503.
    STANDBY = "standby"
    # Every replica of the model was tried already (a retry): the last failure is the answer.
    EXHAUSTED = "exhausted"


class Slot:
    """One request's hold on one slot of ``replica``; given back once, by ``give_back`` or the block's end."""

    __slots__ = ("_activator", "affinity", "replica")

    def __init__(self, activator: Activator, replica: Replica, affinity: Outcome | None = None) -> None:
        self._activator: Activator | None = activator
        self.replica = replica
        # With affinity: how it placed the request (gateway/affinity.py, ``Outcome``); None without.
        self.affinity = affinity

    def give_back(self) -> None:
        activator, self._activator = self._activator, None
        if activator is not None:
            activator._give_back(self.replica)

    def __enter__(self) -> Slot:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.give_back()

    def __del__(self) -> None:
        # A safety net, not the protocol: a slot dropped and never given back (a bug in the caller) would
        # hold the replica's capacity for the life of the daemon.
        activator = self._activator
        if activator is not None:
            activator.dropped += 1
            with contextlib.suppress(Exception):
                self.give_back()
                log.warning(
                    "a replica slot was dropped without being given back; gave it back",
                    extra={"replica": self.replica.id},
                )


class _Waiter:
    __slots__ = ("affinity", "event", "exclude", "priority", "refusal", "slot")

    def __init__(self, priority: Priority, exclude: Collection[str], affinity: Affinity | None) -> None:
        self.event = trio.Event()
        self.priority = priority
        self.exclude = exclude
        self.affinity = affinity
        self.slot: Slot | None = None
        self.refusal: Refusal | None = None


class _Queue:
    """One model's waiters: a FIFO per priority class, and how many interactive ones went in a row."""

    __slots__ = ("classes", "interactive_run", "size")

    def __init__(self) -> None:
        self.classes: tuple[deque[_Waiter], ...] = tuple(deque() for _ in Priority)
        self.size = 0
        self.interactive_run = 0

    def add(self, waiter: _Waiter, *, front: bool) -> None:
        if front:
            self.classes[waiter.priority].appendleft(waiter)
        else:
            self.classes[waiter.priority].append(waiter)
        self.size += 1

    def remove(self, waiter: _Waiter) -> None:
        # Usually the head (the waiter served next), so the scan stops at once.
        self.classes[waiter.priority].remove(waiter)
        self.size -= 1

    def in_order(self, batch_after: int) -> Iterator[_Waiter]:
        """Waiters in the order they are served."""
        interactive, batch = self.classes
        if batch and (not interactive or self.interactive_run >= batch_after):
            yield from batch
            yield from interactive
        else:
            yield from interactive
            yield from batch

    def served(self, waiter: _Waiter) -> None:
        if waiter.priority is Priority.INTERACTIVE and self.classes[Priority.BATCH]:
            self.interactive_run += 1
        else:
            self.interactive_run = 0


class Activator:
    def __init__(
        self,
        replicas: ReplicaSet,
        config: ActivatorConfig = ActivatorConfig(),
        *,
        demand: WaitingRequests | None = None,
        wake: Callable[[], None] | None = None,
        status: Callable[[str], str] | None = None,
    ) -> None:
        self.replicas = replicas
        self.config = config
        # How many requests wait per profile key, counted here and read by the reconciler and the
        # live window (each handed the same ``WaitingRequests`` when built).
        self.demand = demand if demand is not None else WaitingRequests()
        self._wake = wake or (lambda: None)
        self._status = status or (lambda profile_key: "no replica is published")
        self._queues: dict[str, _Queue] = {}
        # Set while this daemon is a standby (the leader's agent address, or ""); None: leading.
        self._standby: str | None = None
        # Slots given back by the safety net rather than their holder: a bug, counted for the tests.
        self.dropped = 0
        # Where each affinity id went last: its conversation's cache (gateway/placements.py).
        self.placements = Placements()
        replicas.listen(self._grant)

    # ------------------------------------------------------------------ leadership

    def stand_down(self, leader_address: str) -> None:
        """This daemon stopped leading: the replica its waiters wait for will never be started here.

        They would otherwise wait out ``max_wait``; they get the standby's 503 naming the leader
        now, which a client retrying through a load balancer turns into a request to the leader.
        """
        self._standby = leader_address
        queues, self._queues = self._queues, {}
        for profile_key, queue in queues.items():
            for waiters in queue.classes:
                for waiter in waiters:
                    waiter.refusal = Refusal.STANDBY
                    waiter.event.set()
            self.demand.queued(profile_key, 0)

    def lead(self) -> None:
        self._standby = None

    def queue_depth(self) -> int:
        return sum(q.size for q in self._queues.values())

    # ------------------------------------------------------------------ taking a slot

    def try_acquire(
        self,
        profile_key: str,
        exclude: Collection[str] = (),
        affinity: Affinity | None = None,
    ) -> Slot | None:
        """A free slot of a replica of ``profile_key`` now, or None. The hot path: synchronous, no
        allocation beyond the guard.

        No waiter is passed over: every slot a waiter could use is handed to it the moment it
        frees, so a free slot found here is one no waiter can take.
        """
        now = trio.current_time()
        replica, outcome = self._pick(profile_key, self.replicas.for_model(profile_key), affinity, now, exclude)
        if replica is None:
            return None
        self._take(replica, now)
        return Slot(self, replica, outcome)

    async def wait(
        self,
        profile_key: str,
        priority: Priority = Priority.INTERACTIVE,
        *,
        exclude: Collection[str] = (),
        front: bool = False,
        affinity: Affinity | None = None,
    ) -> Slot | Refusal:
        """Wait in ``profile_key``'s queue for a slot (after ``try_acquire`` found none).

        ``exclude``: replicas this request already failed on; ``front``: it waited before (a
        retry), so it goes ahead of its class. Cancellation contract: a cancelled wait leaves the
        queue, and a slot granted to it as it was cancelled is given back before the Cancelled
        propagates, so no cancellation can leak a slot.
        """
        slot = self.try_acquire(profile_key, exclude, affinity)
        if slot is not None:
            return slot
        if exclude:
            replicas = self.replicas.for_model(profile_key)
            if all(r.id in exclude for r in replicas):
                return Refusal.EXHAUSTED
        if self._standby is not None:
            return Refusal.STANDBY
        queue = self._queues.get(profile_key)
        if queue is None:
            queue = self._queues[profile_key] = _Queue()
        if queue.size >= self.config.queue_size:
            return Refusal.OVERFLOW
        waiter = _Waiter(priority, exclude, affinity)
        queue.add(waiter, front=front)
        self.demand.queued(profile_key, queue.size)
        self._wake()
        try:
            with trio.move_on_after(self.config.max_wait):
                await waiter.event.wait()
        except BaseException:
            if waiter.slot is not None:
                waiter.slot.give_back()
            raise
        finally:
            if waiter.slot is None and waiter.refusal is None:
                queue.remove(waiter)
                self._counted(profile_key, queue)
        if waiter.slot is not None:
            return waiter.slot
        return waiter.refusal or Refusal.TIMEOUT

    def refusal_error(self, refusal: Refusal, profile_key: str) -> ClientApiError:
        """The client's answer to a wait that ended without a slot (not for EXHAUSTED)."""
        if refusal is Refusal.STANDBY:
            return standby(self._standby or "")
        if refusal is Refusal.OVERFLOW:
            return ClientApiError(
                429,
                f"Model '{profile_key}' has every slot busy and {self.config.queue_size} requests already "
                "waiting; retry shortly.",
                code="model_queue_full",
                headers=(("retry-after", "5"),),
            )
        replicas = self.replicas.for_model(profile_key)
        if not replicas:
            return ClientApiError(
                503,
                f"Model '{profile_key}' has no ready replica after {self.config.max_wait:g} "
                f"s: {self._status(profile_key)}.",
                code="model_not_ready",
                headers=(("retry-after", "10"),),
            )
        slots = sum(r.slots for r in replicas)
        return ClientApiError(
            503,
            f"Model '{profile_key}' had every slot busy for {self.config.max_wait:g} s "
            f"({len(replicas)} replica(s), {slots} slot(s)); retry later.",
            code="model_overloaded",
            headers=(("retry-after", "10"),),
        )

    # ------------------------------------------------------------------ handing slots on

    def _pick(
        self,
        profile_key: str,
        replicas: list[Replica],
        affinity: Affinity | None,
        now: float,
        exclude: Collection[str],
    ) -> tuple[Replica | None, Outcome | None]:
        """``affinity.pick`` for model ``profile_key`` with this daemon's placement memory: read before,
        written after."""
        if affinity is None:
            return pick(replicas, None, now=now, exclude=exclude)
        replica, outcome = pick(
            replicas, affinity, now=now, exclude=exclude, placed=self.placements.get(profile_key, affinity.id)
        )
        if replica is not None:
            self.placements.record(profile_key, affinity.id, replica.id)
        return replica, outcome

    def _take(self, replica: Replica, now: float) -> None:
        replica.in_flight += 1
        if replica.in_flight >= replica.slots and replica.full_since is None:
            replica.full_since = now

    def _give_back(self, replica: Replica) -> None:
        replica.in_flight -= 1
        replica.last_used = trio.current_time()
        if self._queues:
            for model in replica.models:
                if model in self._queues:
                    self._grant(model)
        if replica.in_flight < replica.slots:
            replica.full_since = None

    def _grant(self, profile_key: str) -> None:
        """Hand every free slot of ``profile_key``'s replicas that a waiter can use to the next such waiter."""
        queue = self._queues.get(profile_key)
        if queue is None:
            return
        replicas = self.replicas.for_model(profile_key)
        now = trio.current_time()
        while queue.size and choose(replicas, now=now) is not None:
            for waiter in queue.in_order(self.config.batch_after):
                replica, outcome = self._pick(profile_key, replicas, waiter.affinity, now, waiter.exclude)
                if replica is not None:
                    break
            else:
                break  # the free slots are on replicas every waiter already failed on
            queue.remove(waiter)
            queue.served(waiter)
            self._take(replica, now)
            waiter.slot = Slot(self, replica, outcome)
            waiter.event.set()
        self._counted(profile_key, queue)

    def _counted(self, profile_key: str, queue: _Queue) -> None:
        self.demand.queued(profile_key, queue.size)
        if not queue.size and self._queues.get(profile_key) is queue:
            del self._queues[profile_key]
