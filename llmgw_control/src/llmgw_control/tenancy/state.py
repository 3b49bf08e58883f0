"""``TenancyState``: keys, the group tree and quotas in memory, kept in step with the store.

``load`` reads everything at start and rebuilds the usage windows from the store's hourly usage
rows; ``run`` (a trio task) then polls the store's change counters every ``poll_interval``
seconds and reloads what moved, so a key revoked through any daemon stops working here within
about half a second. The data path (``authenticate``, ``chain``) only reads memory.

What a restart can rebuild (see docs/tenancy.md):
- tokens/day: exactly, from the hourly rows since UTC midnight (the day window is fixed to the
  UTC day, and usage is recorded in the hour it is settled).
- tokens/minute and requests/minute: only an estimate. Rows are hourly, so the last minute's
  share is estimated assuming an even rate over the hour, and spread over the past minute so it
  ages out gradually.
- concurrent requests: nothing to rebuild; requests in flight died with the old process.
- usage not yet flushed when a daemon was killed (at most one flush interval) is lost to both
  the usage report and the rebuilt windows.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import trio

from llmgw_shared.logs import get_logger

from ..api_errors import ClientApiError
from ..priority import Priority, parse_priority
from ..store import Group, KeyChanges, Quota, Revisions, Store, StoreError
from .budget import GroupBudget
from .keys import MAX_KEY_LENGTH, KeyDigester, bearer_token
from .keytable import KeyEntry, KeyTable
from .tree import GroupTree
from .windows import DAY, MINUTE, Clock, SlidingWindow

log = get_logger(__name__)

_HOUR = 3600
# How many slices a restored minute estimate is spread over (ages out in steps of 10 s).
_RESTORE_SLICES = 6
_AUTH_HEADERS = (("www-authenticate", "Bearer"),)


class TenancyState:
    def __init__(
        self,
        store: Store,
        digester: KeyDigester,
        *,
        clock: Clock = time.time,
        poll_interval: float = 0.5,
        restore_minute_windows: bool = True,
    ) -> None:
        self.store = store
        self.digester = digester
        self.clock = clock
        self.poll_interval = poll_interval
        self.restore_minute_windows = restore_minute_windows
        self.keys = KeyTable()
        self.tree = GroupTree()
        self.quotas: dict[str, Quota] = {}
        self.loaded = False
        self._budgets: dict[str, GroupBudget] = {}
        self._chains: dict[str, tuple[GroupBudget, ...]] = {}
        # Each group's effective priority, computed on first use like the chains.
        self._priorities: dict[str, Priority] = {}
        self._revisions: Revisions | None = None
        self._key_marker = 0
        # One reload at a time: two interleaved refreshes could apply an older key snapshot after
        # a newer one and bring a revoked key back to life until the next poll.
        self._lock = trio.Lock()
        self._failing = False

    # --- the data path (synchronous, memory only) -------------------------------------------

    @property
    def open(self) -> bool:
        """True when no key exists at all (revoked ones count as existing): every request is let in."""
        return len(self.keys) == 0

    def authenticate(self, authorization: str | None) -> KeyEntry:
        """The usable key named by an ``Authorization`` header, or ``ClientApiError(401)``."""
        token = bearer_token(authorization)
        if token is None:
            raise ClientApiError(
                401,
                "Missing API key: send it as 'Authorization: Bearer <key>'.",
                code="missing_api_key",
                headers=_AUTH_HEADERS,
            )
        key = self.keys.get(self.digester.digest(token)) if len(token) <= MAX_KEY_LENGTH else None
        if key is None:
            raise ClientApiError(401, "Incorrect API key provided.", code="invalid_api_key", headers=_AUTH_HEADERS)
        if key.revoked:
            raise ClientApiError(401, "This API key has been revoked.", code="api_key_revoked", headers=_AUTH_HEADERS)
        if key.expired(self.clock()):
            assert key.expires_at is not None
            when = datetime.fromtimestamp(key.expires_at, UTC).isoformat(timespec="seconds")
            raise ClientApiError(401, f"This API key expired at {when}.", code="api_key_expired", headers=_AUTH_HEADERS)
        return key

    def chain(self, group_id: str) -> tuple[GroupBudget, ...]:
        """The budgets a request of ``group_id`` counts against: the group, then each ancestor."""
        chain = self._chains.get(group_id)
        if chain is None:
            chain = self._chains[group_id] = tuple(self.budget(g) for g in self.tree.ancestry(group_id))
        return chain

    def priority(self, group_id: str) -> Priority:
        """The group's priority class: its own, else its nearest ancestor's, else interactive."""
        priority = self._priorities.get(group_id)
        if priority is None:
            priority = Priority.INTERACTIVE
            for ancestor in self.tree.ancestry(group_id):
                group = self.tree.groups.get(ancestor)
                if group is not None and group.priority is not None:
                    priority = parse_priority(group.priority)
                    break
            self._priorities[group_id] = priority
        return priority

    def budget(self, group_id: str) -> GroupBudget:
        budget = self._budgets.get(group_id)
        if budget is None:
            budget = self._budgets[group_id] = GroupBudget(
                group_id, self.tree.path(group_id), self.quotas.get(group_id)
            )
        return budget

    # --- loading and refreshing -------------------------------------------------------------

    async def load(self) -> None:
        """Read keys, groups and quotas, and rebuild the usage windows (once, at start)."""
        async with self._lock:
            # Counters first: anything written after this read is picked up by the next poll.
            revisions = await self.store.revisions()
            changes = await self.store.keys_changed_since(0)
            groups = await self.store.list_groups()
            quotas = await self.store.list_quotas()
            self._apply_keys(changes)
            self._apply_groups(groups, quotas)
            if not self.loaded:
                await self._restore_windows()
            self._revisions = revisions
            self.loaded = True
        foreign = sum(1 for d in self.keys.digests() if not self.digester.made_here(d))
        if foreign:
            log.error(
                "%d API key(s) were made with a different key secret and cannot authenticate here: "
                "every control daemon sharing this store needs the same key secret file",
                foreign,
            )
        log.info("tenancy loaded", extra={"keys": len(self.keys), "groups": len(self.tree), "quotas": len(self.quotas)})

    async def refresh(self) -> bool:
        """Reload what changed in the store since the last look; True if anything did."""
        if not self.loaded:
            await self.load()
            return True
        async with self._lock:
            revisions = await self.store.revisions()
            keys = None
            if revisions.keys != self._key_marker:
                keys = await self.store.keys_changed_since(self._key_marker)
                # Those keys may have been committed after the counters were read, and so may a
                # quota written just before one of them (set a quota, then make its key): read
                # the counters again, so that the quota is loaded no later than the key.
                revisions = await self.store.revisions()
            seen = self._revisions
            groups = None
            if seen is None or (revisions.groups, revisions.quotas) != (seen.groups, seen.quotas):
                groups = (await self.store.list_groups(), await self.store.list_quotas())
            # Applied together, with no await in between: no request is admitted with a new key
            # and the quotas of before (seen: 8 of a 6-per-minute limit, one poll's worth).
            if groups is not None:
                self._apply_groups(*groups)
            if keys is not None:
                self._apply_keys(keys)
            self._revisions = revisions
            return keys is not None or groups is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load (retrying until the store answers), report started, then poll for changes forever.

        ``nursery.start(state.run)`` returns once the state is loaded: until then the gateway
        must not serve, or an unreachable store would look like "no keys" and open it.
        """
        while not self.loaded:
            try:
                await self.load()
            except StoreError as exc:
                log.warning("cannot load keys and quotas yet, retrying: %s", exc)
                await trio.sleep(max(self.poll_interval, 1.0))
        task_status.started()
        while True:
            await trio.sleep(self.poll_interval)
            try:
                await self.refresh()
            except StoreError as exc:
                # Keep serving with what we know; say so once per outage, not twice a second.
                if not self._failing:
                    log.warning("cannot refresh keys and quotas (serving with the last known ones): %s", exc)
                self._failing = True
            else:
                if self._failing:
                    log.info("keys and quotas are refreshing again")
                self._failing = False

    def _apply_keys(self, changes: KeyChanges) -> None:
        was_open = self.open
        self.keys.apply(changes)
        self._key_marker = changes.revision
        if self.loaded and was_open != self.open:
            if self.open:
                log.warning("no API keys exist any more: the gateway is open to every request")
            else:
                log.info("API keys exist now: every request needs one")

    def _apply_groups(self, groups: list[Group], quotas: dict[str, Quota]) -> None:
        self.tree = GroupTree(groups)
        self.quotas = quotas
        # Budgets keep their counters across reloads (tickets in flight hold them); only their
        # quota and label change. A group that moved counts towards its new ancestors from now on.
        for group_id in list(self._budgets):
            if group_id in self.tree:
                budget = self._budgets[group_id]
                budget.quota = quotas.get(group_id)
                budget.label = self.tree.path(group_id)
            else:
                del self._budgets[group_id]
        self._chains = {}
        self._priorities = {}

    async def _restore_windows(self) -> None:
        now = self.clock()
        midnight = now // DAY * DAY
        this_hour = now // _HOUR * _HOUR
        since = min(midnight, this_hour - _HOUR)
        rows = await self.store.query_usage(since=datetime.fromtimestamp(since, UTC))
        elapsed = now - this_hour
        day: dict[str, int] = {}
        minute_tokens: dict[str, float] = {}
        minute_requests: dict[str, float] = {}
        for row in rows:
            if not row.group_id:
                continue  # served by an open gateway: no group to count against
            start = row.hour.timestamp()
            tokens = row.prompt_tokens + row.completion_tokens
            for group_id in self.tree.ancestry(row.group_id):
                if start >= midnight:
                    day[group_id] = day.get(group_id, 0) + tokens
                share = _minute_share(start, this_hour, elapsed)
                if share and self.restore_minute_windows:
                    minute_tokens[group_id] = minute_tokens.get(group_id, 0.0) + tokens * share
                    minute_requests[group_id] = minute_requests.get(group_id, 0.0) + row.requests * share
        for group_id, tokens_today in day.items():
            self.budget(group_id).day_tokens.add(now, tokens_today)
        for group_id, estimate in minute_tokens.items():
            _spread(self.budget(group_id).minute_tokens, now, math.ceil(estimate))
        for group_id, estimate in minute_requests.items():
            _spread(self.budget(group_id).requests, now, math.ceil(estimate))
        if day:
            log.info("usage windows rebuilt from the store", extra={"groups": len(day)})


def _minute_share(hour_start: float, this_hour: float, elapsed: float) -> float:
    """The share of an hour row's usage assumed to fall in the last minute (even rate over the hour)."""
    if hour_start == this_hour:
        return 1.0 if elapsed <= MINUTE else MINUTE / elapsed
    if hour_start == this_hour - _HOUR and elapsed < MINUTE:
        return (MINUTE - elapsed) / _HOUR
    return 0.0


def _spread(target: SlidingWindow, now: float, amount: int) -> None:
    if amount <= 0:
        return
    step = MINUTE // _RESTORE_SLICES
    base, extra = divmod(amount, _RESTORE_SLICES)
    for i in range(_RESTORE_SLICES):
        # Oldest first, so each slice gets its own bucket; the remainder goes to the newest.
        part = base + (extra if i == _RESTORE_SLICES - 1 else 0)
        if part:
            target.add(now - MINUTE + step // 2 + i * step, part)
