"""The leader's view of ready replicas, shared through the store so standbys serve too.

* ``ViewPublisher`` (leader, after its takeover hold): writes the replicas its reconciler
  publishes to the gateway whenever that set changes, at most every ``PUBLISH_EVERY`` seconds,
  fenced by its lease epoch.
* ``ViewFollower`` (standby): reads the view and makes its own gateway's replica set match it:
  added, updated, withdrawn. The bearer keys are derived here from the shared cluster secret,
  exactly as the reconciler derives them; the view holds none.

When it reads: on PostgreSQL the leader's write NOTIFIES its revision and the follower holds
one LISTEN connection (store/view_notify.py): it reads when notified, fully at start and after
every (re)connect of that connection, and every ``SAFETY_POLL`` seconds in case a notification
was lost; while that connection is down it polls every ``FOLLOW_EVERY`` seconds, as on SQLite
(no notifications). Either way a
standby stays within a second of the leader, the bound promised; with notifications the delay
is the leader's ``PUBLISH_EVERY`` plus a round trip (docs/performance.md has the figures).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

from llmgw_shared.logs import get_logger

from ..gateway.replicas import Replica, ReplicaSet
from ..store import PublishedReplica, PublishedReplicas, StoreError, ViewListener

log = get_logger(__name__)

# The leader's bound on write rate: a burst of replica changes costs one write per quarter second.
PUBLISH_EVERY = 0.25
# A standby's poll without notifications (SQLite): with the leader's PUBLISH_EVERY, a change
# reaches it well within a second.
FOLLOW_EVERY = 0.5
# With notifications (PostgreSQL), the read that heals a lost one (a NOTIFY that the server
# dropped, a wait that missed it): rare enough to cost nothing, soon enough that a standby is
# not wrong for long even then.
SAFETY_POLL = 5.0
# A store that does not answer this fast is skipped for this round (the next one retries).
_STORE_WAIT = 5.0


class ViewStore(Protocol):
    async def replica_view(self) -> PublishedReplicas | None: ...
    def view_listener(self) -> ViewListener | None: ...
    async def publish_view(self, epoch: int, replicas: list[PublishedReplica]) -> int | None: ...


def view_of(replicas: ReplicaSet, ids: set[str]) -> list[PublishedReplica]:
    """The entries for the replicas in ``ids`` (the reconciler's), one profile key each."""
    entries = []
    for replica in replicas:
        if replica.id in ids and replica.models:
            entries.append(
                PublishedReplica(
                    id=replica.id,
                    profile_key=min(replica.models),
                    url=replica.url,
                    slots=replica.slots,
                    served_name=replica.served_name,
                    adapters=replica.adapters,
                    adapter_mode=replica.adapter_mode,
                )
            )
    return sorted(entries, key=lambda e: e.id)


class ViewPublisher:
    def __init__(self, store: ViewStore, replicas: ReplicaSet, published: Callable[[], set[str]]) -> None:
        self.store = store
        self.replicas = replicas
        self.published = published

    async def run(self, epoch: int) -> None:
        """Publish on every change until cancelled or deposed (a refused write ends the term)."""
        written: list[PublishedReplica] | None = None
        while True:
            current = view_of(self.replicas, self.published())
            if current != written:
                with trio.move_on_after(_STORE_WAIT):
                    try:
                        if await self.store.publish_view(epoch, current) is None:
                            log.info("a later leader publishes the replica view: stopping", extra={"epoch": epoch})
                            return
                        written = current
                    except StoreError as exc:
                        log.warning("cannot publish the replica view (%s): retrying", exc)
            await trio.sleep(PUBLISH_EVERY)


class ViewFollower:
    """Keeps ``replicas`` equal to the leader's view; owns only the replicas it added."""

    def __init__(
        self,
        store: ViewStore,
        replicas: ReplicaSet,
        api_key: Callable[[str], str],
        *,
        listener: ViewListener | None = None,
        safety_poll: float = SAFETY_POLL,
        poll: float = FOLLOW_EVERY,
    ) -> None:
        """``listener`` defaults to the store's (None on SQLite); tests pass their own, and long
        polls to show a change arrives by notification or by the read after a reconnect."""
        self.store = store
        self.replicas = replicas
        self.api_key = api_key
        self.listener = listener if listener is not None else store.view_listener()
        self.safety_poll = safety_poll
        self.poll = poll
        self.owned: set[str] = set()
        self.revision: int | None = None
        self.reads = 0  # reads of the view that completed (for tests)
        self._wake = trio.Event()

    def apply(self, view: PublishedReplicas | None) -> None:
        entries = {e.id: e for e in view.replicas} if view is not None else {}
        for replica_id in self.owned - set(entries):
            self.replicas.withdraw(replica_id)
        for entry in entries.values():
            current = self.replicas.get(entry.id)
            if (
                current is not None
                and current.url == entry.url
                and current.slots == entry.slots
                and current.models == frozenset({entry.profile_key})
                and current.adapters == entry.adapters
            ):
                continue  # unchanged: keep its counters (in flight, cooldown)
            self.replicas.publish(
                Replica(
                    id=entry.id,
                    url=entry.url,
                    models=frozenset({entry.profile_key}),
                    slots=entry.slots,
                    served_name=entry.served_name,
                    adapters=entry.adapters,
                    adapter_mode=entry.adapter_mode,
                    api_key=self.api_key(entry.id),
                    last_used=trio.current_time(),
                )
            )
        self.owned = set(entries)
        self.revision = view.revision if view is not None else None

    def hand_over(self) -> set[str]:
        """Stop owning what was added (on becoming leader): the replicas stay routable; the new
        leader's reconciler adopts them or withdraws them after its hold."""
        owned, self.owned, self.revision = self.owned, set(), None
        return owned

    def withdraw_all(self) -> None:
        for replica_id in self.owned:
            self.replicas.withdraw(replica_id)
        self.owned = set()
        self.revision = None

    def _notified(self, revision: int | None) -> None:
        """From the listener: read now (``None``: after a (re)connect; a revision: one was
        published; the one we have already is skipped, a read would find nothing new)."""
        if revision is None or revision != self.revision:
            self._wake.set()

    async def run(self) -> None:
        """Follow until cancelled: a full read each time (the row is small)."""
        async with trio.open_nursery() as nursery:
            if self.listener is not None:
                nursery.start_soon(self.listener.run, self._notified)
            while True:
                # A fresh event before the read: a notification during the read means another.
                self._wake = trio.Event()
                await self._read()
                await self._until_next_read()

    def _interval(self) -> float:
        listening = self.listener is not None and self.listener.listening
        return self.safety_poll if listening else self.poll

    async def _until_next_read(self) -> None:
        """Until notified, or the poll is due. Checked in short slices: a LISTEN connection lost
        during a long safety wait must turn this back into the short poll at once."""
        start = trio.current_time()
        while (remaining := start + self._interval() - trio.current_time()) > 0:
            with trio.move_on_after(min(remaining, FOLLOW_EVERY)):
                await self._wake.wait()
                return

    async def _read(self) -> None:
        with trio.move_on_after(_STORE_WAIT):
            try:
                view = await self.store.replica_view()
                if view is None or view.revision != self.revision:
                    self.apply(view)
                self.reads += 1
            except StoreError as exc:
                log.warning("cannot read the replica view (%s): serving the last one", exc)
