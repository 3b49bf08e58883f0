"""``LeaseKeeper``: the trio task that holds (or waits for) the leader lease.

It acquires or renews every ``renew_interval`` and publishes the daemon's ``Role``: leader with
its epoch, or standby with the leader's address (so a standby can tell nodes where to go).

Safety rests on one local rule: a grant obtained by a statement *sent* at local time ``t`` is
trusted only until ``t + ttl - margin`` on trio's monotonic clock. The database set the expiry
to (its now) + ttl, and its now was no earlier than ``t``, so our bound ends first whatever the
clocks of the two machines say. A renew is bounded by that deadline (store calls return at once
when cancelled, see ``backend``); if it fails, is refused, or does not finish in time, the keeper
steps down at once: role → standby and the callbacks run before the lease can lapse under it.
Stepping down on any failed renew (rather than retrying until the deadline) is deliberate: a
leader that cannot reach the database should stop acting as one, and if the lease turns out to
be still ours the next poll re-acquires it with the same epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from .errors import StoreError
from .lease import Lease
from .records import LeaseGrant

log = logging.getLogger(__name__)


@attrs.frozen
class Role:
    """What this daemon is now. ``epoch`` is set only for a leader and fences its commands;
    ``leader_address``/``leader_holder`` name the leader a standby knows of (None: nobody/unknown)."""

    leader: bool
    epoch: int | None = None
    leader_address: str | None = None
    leader_holder: str | None = None


STANDBY = Role(leader=False)

RoleCallback = Callable[[Role], None]


class LeaseKeeper:
    def __init__(
        self,
        lease: Lease,
        holder: str,
        address: str,
        *,
        ttl: float = 10.0,
        renew_interval: float = 3.0,
        margin: float | None = None,
        poll_interval: float | None = None,
    ) -> None:
        margin = min(1.0, ttl / 5) if margin is None else margin
        if not 0 < renew_interval < ttl - margin or margin <= 0:
            raise ValueError(
                f"need 0 < renew_interval ({renew_interval}) < ttl ({ttl}) - margin ({margin}) and margin > 0"
            )
        # How often a standby tries to acquire (default: every 0.5 s, or renew_interval if
        # shorter). Separate from renew_interval so a lease given up is taken over promptly
        # (SIGTERM hand-over within a second) and a lapsed one within TTL + 0.5 s, while the
        # leader renews at a relaxed pace; an attempt that finds the lease held changes nothing.
        poll_interval = min(renew_interval, 0.5) if poll_interval is None else poll_interval
        if not 0 < poll_interval <= renew_interval:
            raise ValueError(f"need 0 < poll_interval ({poll_interval}) <= renew_interval ({renew_interval})")
        self.poll_interval = poll_interval
        self._lease = lease
        self.holder = holder
        self.address = address
        self.ttl = ttl
        self.renew_interval = renew_interval
        self.margin = margin
        self._role = STANDBY
        self._changed = trio.Event()
        self._callbacks: list[RoleCallback] = []
        # While leader: when the last successful grant's statement was sent (trio clock).
        self._granted_at = 0.0
        self._stopping = False
        self._wake = trio.Event()
        # Held around every lease statement, so give_up() runs after any in-flight acquire and
        # cannot be overtaken by it (which would leave an orphan lease until its TTL).
        self._op_lock = trio.Lock()

    # -- the published state ------------------------------------------------------------------

    @property
    def role(self) -> Role:
        return self._role

    def on_change(self, callback: RoleCallback) -> None:
        """Call ``callback(role)`` on every change, synchronously, in the keeper's task.

        It must not block; exceptions propagate and end the keeper (a daemon that cannot react
        to losing leadership should not go on silently).
        """
        self._callbacks.append(callback)

    async def wait_change(self, seen: Role) -> Role:
        """Wait until the role differs from ``seen``; return the new role."""
        while self._role == seen:
            await self._changed.wait()
        return self._role

    async def wait_leader(self) -> Role:
        while not self._role.leader:
            await self._changed.wait()
        return self._role

    def _set_role(self, role: Role) -> None:
        if role == self._role:
            return
        old, self._role = self._role, role
        if old.leader and not role.leader:
            log.warning("stepping down: no longer the leader", extra={"epoch": old.epoch})
        elif role.leader:
            log.info("became the leader", extra={"epoch": role.epoch, "address": self.address})
        changed, self._changed = self._changed, trio.Event()
        changed.set()
        for callback in list(self._callbacks):
            callback(role)

    def _step_down(self, reason: str) -> None:
        if self._role.leader:
            log.warning("leader lease: %s", reason)
        self._set_role(STANDBY)

    # -- the task -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Role] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the lease until cancelled or given up; ``started`` after the first attempt.

        Cancelling steps down (callbacks run) but does *not* give up the lease: a killed leader
        is replaced after the TTL. Call ``give_up()`` for a prompt hand-over.
        """
        started = False
        try:
            while not self._stopping:
                if self._role.leader:
                    await self._renew()
                else:
                    await self._acquire()
                if not started:
                    task_status.started(self._role)
                    started = True
                await self._pause()
        finally:
            self._step_down("the keeper stopped")
        if not started:
            task_status.started(self._role)

    async def _pause(self) -> None:
        if self._role.leader:
            wake_at = self._granted_at + self.renew_interval
        else:
            wake_at = trio.current_time() + self.poll_interval
        with trio.move_on_at(wake_at):
            await self._wake.wait()

    def _trusted_until(self, sent: float) -> float:
        return sent + self.ttl - self.margin

    async def _acquire(self) -> None:
        grant: LeaseGrant | None = None
        sent = trio.current_time()
        try:
            # A standby's poll must not hang either: bound it by one renew interval.
            with trio.fail_after(self.renew_interval):
                async with self._op_lock:
                    if self._stopping:
                        return
                    sent = trio.current_time()
                    grant = await self._lease.try_acquire(self.holder, self.address, self.ttl)
                    info = None if grant is not None else await self._lease.current()
        except (StoreError, trio.TooSlowError) as exc:
            # Keep the last known leader address: a blip should not make nodes lose the way.
            log.warning("leader lease: acquire attempt failed: %s", exc or "timed out")
            return
        if grant is not None:
            if self._stopping:
                # give_up() began while this acquire was in flight; it gives up the row once
                # we drop the lock, so do not claim a lead that is about to be given up.
                return
            if trio.current_time() >= self._trusted_until(sent):
                # Granted, but too late to be of use; it lapses by itself and the next
                # acquisition gets a new epoch.
                log.warning("leader lease: grant arrived too late to use")
                return
            self._granted_at = sent
            self._set_role(Role(leader=True, epoch=grant.epoch, leader_address=self.address, leader_holder=self.holder))
        elif info is not None:
            self._set_role(Role(leader=False, leader_address=info.address, leader_holder=info.holder))

    async def _renew(self) -> None:
        deadline = self._trusted_until(self._granted_at)
        sent = trio.current_time()
        try:
            with trio.fail_at(deadline):
                async with self._op_lock:
                    sent = trio.current_time()
                    grant = await self._lease.renew(self.holder, self.ttl)
        except trio.TooSlowError:
            self._step_down("renew did not complete before the lease's safety margin")
            return
        except StoreError as exc:
            self._step_down(f"renew failed: {exc}")
            return
        if grant is None:
            self._step_down("the lease was lost (it lapsed or another holder took it)")
            return
        if grant.epoch != self._role.epoch:
            self._step_down(f"the epoch changed under us ({self._role.epoch} → {grant.epoch})")
            return
        self._granted_at = sent

    async def give_up(self) -> bool:
        """Step down and give the lease up so a standby takes over on its next poll.

        For SIGTERM: the keeper stops trying to lead. Bounded by one renew interval, so a
        dead database cannot hold up shutdown. True if the database confirmed.
        """
        self._stopping = True
        self._wake.set()
        self._step_down("giving up the lease")
        with trio.move_on_after(self.renew_interval):
            async with self._op_lock:
                try:
                    return await self._lease.give_up(self.holder)
                except StoreError as exc:
                    log.warning("leader lease: giving it up failed (a standby takes over after the TTL): %s", exc)
        return False
