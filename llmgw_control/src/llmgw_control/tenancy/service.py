"""What the admin API and the CLI call to change and read tenancy: groups, keys, quotas, usage.

Every function validates its input before anything is written, and raises the store's error
types, which the admin API maps to statuses: ``InvalidInput`` (400, names the field),
``NotFound`` (404), ``Conflict`` (409). After a write, this daemon's ``TenancyState`` is
refreshed at once; other daemons see the change within one poll.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Unpack

import attrs

from llmgw_shared.logs import get_logger

from ..store import (
    UNSET,
    ApiKey,
    Group,
    InvalidInput,
    Quota,
    Store,
    StoreError,
    Unset,
    Usage,
    UsageQuery,
    UsageTotals,
)
from .keys import new_key_secret
from .state import TenancyState
from .usage import UsageAccumulator, merge

log = get_logger(__name__)

QUOTA_FIELDS = tuple(f.name for f in attrs.fields(Quota))


@attrs.frozen
class CreatedKey:
    """A new key and its secret. The secret exists only here: show it once, never store or log it."""

    key: ApiKey
    secret: str = attrs.field(repr=False)


def parse_quota(value: object, field: str = "quota") -> Quota:
    """A ``Quota`` from JSON-shaped input: an object of optional non-negative integers (or null).

    A limit of 0 is allowed and refuses everything of that kind (a way to pause a group).
    """
    if not isinstance(value, Mapping):
        raise InvalidInput(field, "must be an object")
    unknown = sorted(str(k) for k in value if k not in QUOTA_FIELDS)
    if unknown:
        raise InvalidInput(f"{field}.{unknown[0]}", f"is not a quota limit (known: {', '.join(QUOTA_FIELDS)})")
    limits: dict[str, int | None] = {}
    for name in QUOTA_FIELDS:
        limit = value.get(name)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise InvalidInput(f"{field}.{name}", "must be a non-negative integer or null")
        limits[name] = limit
    return Quota(**limits)


def _aware(field: str, value: datetime | None) -> datetime | None:
    if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
        raise InvalidInput(field, "must be a timezone-aware datetime")
    return value


class TenancyService:
    def __init__(self, store: Store, state: TenancyState, usage: UsageAccumulator | None = None) -> None:
        self.store = store
        self.state = state
        self.usage = usage

    async def _refresh(self) -> None:
        """Show this daemon the write at once. The write has committed by now: a failing refresh
        must not turn it into an error for the caller, and the next poll will catch up."""
        try:
            await self.state.refresh()
        except StoreError as exc:
            log.warning("changed the store, but could not reload tenancy yet (the next poll will): %s", exc)

    # --- groups -----------------------------------------------------------------------------

    async def create_group(self, name: str, parent_id: str | None = None, *, priority: str | None = None) -> Group:
        group = await self.store.create_group(name, parent_id, priority=priority)
        await self._refresh()
        return group

    async def update_group(
        self,
        group_id: str,
        *,
        name: str | Unset = UNSET,
        parent_id: str | Unset | None = UNSET,
        priority: str | Unset | None = UNSET,
    ) -> Group:
        """Rename, move and/or set the priority of a group. A moved group's history stays with its
        old ancestors."""
        group = await self.store.update_group(group_id, name=name, parent_id=parent_id, priority=priority)
        await self._refresh()
        return group

    async def delete_group(self, group_id: str) -> None:
        await self.store.delete_group(group_id)
        await self._refresh()

    async def get_group(self, group_id: str) -> Group:
        return await self.store.get_group(group_id)

    async def list_groups(self) -> list[Group]:
        return await self.store.list_groups()

    # --- keys -------------------------------------------------------------------------------

    async def create_key(
        self,
        *,
        name: str,
        group_id: str,
        models: Sequence[str] | None = None,
        admin: bool = False,
        expires_at: datetime | None = None,
    ) -> CreatedKey:
        """Make a key; the returned secret is the only copy there will ever be."""
        if _aware("expires_at", expires_at) is not None:
            assert expires_at is not None
            if expires_at.timestamp() <= self.state.clock():
                raise InvalidInput("expires_at", "must be in the future")
        secret = new_key_secret()
        key = await self.store.create_key(
            name=name,
            group_id=group_id,
            digest=self.state.digester.digest(secret),
            models=models,
            admin=admin,
            expires_at=expires_at,
        )
        await self._refresh()
        return CreatedKey(key, secret)

    async def update_key(
        self,
        key_id: str,
        *,
        name: str | Unset = UNSET,
        group_id: str | Unset = UNSET,
        models: Sequence[str] | Unset | None = UNSET,
        admin: bool | Unset = UNSET,
        expires_at: datetime | Unset | None = UNSET,
    ) -> ApiKey:
        if not isinstance(expires_at, Unset):
            _aware("expires_at", expires_at)
        key = await self.store.update_key(
            key_id, name=name, group_id=group_id, models=models, admin=admin, expires_at=expires_at
        )
        await self._refresh()
        return key

    async def revoke_key(self, key_id: str) -> ApiKey:
        """Revoke a key: refused here at once, on every other daemon within one poll."""
        key = await self.store.revoke_key(key_id)
        await self._refresh()
        return key

    async def delete_key(self, key_id: str) -> None:
        await self.store.delete_key(key_id)
        await self._refresh()

    async def get_key(self, key_id: str) -> ApiKey:
        return await self.store.get_key(key_id)

    async def list_keys(self, group_id: str | None = None) -> list[ApiKey]:
        return await self.store.list_keys(group_id)

    # --- quotas -----------------------------------------------------------------------------

    async def set_quota(self, group_id: str, quota: Quota | Mapping[str, object]) -> Quota:
        """Create or replace a group's limits (a ``Quota`` or its JSON form)."""
        parsed = parse_quota(attrs.asdict(quota) if isinstance(quota, Quota) else quota)
        stored = await self.store.set_quota(group_id, parsed)
        await self._refresh()
        return stored

    async def delete_quota(self, group_id: str) -> None:
        await self.store.delete_quota(group_id)
        await self._refresh()

    async def get_quota(self, group_id: str) -> Quota | None:
        return await self.store.get_quota(group_id)

    async def list_quotas(self) -> dict[str, Quota]:
        return await self.store.list_quotas()

    # --- usage ------------------------------------------------------------------------------

    async def query_usage(self, *, include_pending: bool = True, **query: Unpack[UsageQuery]) -> list[Usage]:
        """Hourly usage rows matching every filter; ``include_pending`` adds what this daemon has
        counted but not yet flushed (so a report is current to the request, not to the flush).

        ``since`` rounds down to its hour; ``until`` is exclusive.
        """
        since, until = _aware("since", query.get("since")), _aware("until", query.get("until"))
        if since is not None and until is not None and until <= since:
            raise InvalidInput("until", "must be after since")
        group_id, key_id, model = query.get("group_id"), query.get("key_id"), query.get("model")
        if group_id is not None:
            await self.store.get_group(group_id)  # NotFound (404) rather than an empty report
        rows = await self.store.query_usage(**query)
        if include_pending and self.usage is not None:
            groups = None
            if group_id is not None:
                groups = self.state.tree.subtree(group_id) if query.get("include_descendants") else {group_id}
            lo = None if since is None else since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
            rows += [
                u
                for u in self.usage.pending()
                if (groups is None or u.group_id in groups)
                and (key_id is None or u.key_id == key_id)
                and (model is None or u.model == model)
                and (lo is None or u.hour >= lo)
                and (until is None or u.hour < until)
            ]
        return merge(rows)

    async def usage_totals(self, *, include_pending: bool = True, **query: Unpack[UsageQuery]) -> UsageTotals:
        rows = await self.query_usage(include_pending=include_pending, **query)
        return _total(rows)

    async def usage_rollup(
        self,
        group_id: str | None = None,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        include_pending: bool = True,
    ) -> dict[str, UsageTotals]:
        """Each group's usage *including its descendants*, for ``group_id``'s subtree (or every
        group): one query, summed up the tree in memory."""
        rows = await self.query_usage(
            group_id=group_id, include_descendants=True, since=since, until=until, include_pending=include_pending
        )
        tree = self.state.tree
        scope = tree.subtree(group_id) if group_id is not None else set(tree.groups)
        sums: dict[str, list[int]] = {g: [0, 0, 0] for g in scope}
        for u in rows:
            if not u.group_id:
                continue
            for ancestor in tree.ancestry(u.group_id):
                counts = sums.get(ancestor)
                if counts is not None:
                    counts[0] += u.requests
                    counts[1] += u.prompt_tokens
                    counts[2] += u.completion_tokens
        return {g: UsageTotals(*v) for g, v in sorted(sums.items())}


def _total(rows: Sequence[Usage]) -> UsageTotals:
    return UsageTotals(
        sum(u.requests for u in rows), sum(u.prompt_tokens for u in rows), sum(u.completion_tokens for u in rows)
    )
