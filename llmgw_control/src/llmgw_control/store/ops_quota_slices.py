"""Quota slices: each daemon leases parts of its groups' limits, in one transaction per renewal.

``lease_slices`` closes the holder's old grants (the unspent part goes back: a closed row keeps
only what was spent) and makes new ones, for every group and kind asked, in ONE transaction
that first locks the groups' rows in id order (PostgreSQL ``SELECT … FOR UPDATE``; SQLite's
write transaction excludes every other writer already). Two daemons leasing under the same
ancestor are therefore serialised on that ancestor's row, and each sees the other's grant: the
sum of the rows never exceeds a limit (slice_math.py says why that is enough, windows included).
The limits are read from ``quotas`` inside the same transaction, not from a daemon's cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .backend import Tx
from .errors import InvalidInput
from .ops_base import OpsBase, new_id
from .slice_math import CONCURRENT, KINDS, MICROS, closed_counts_until, lease_times, slice_amount

# Bounds on one call, against a damaged caller: a daemon asks for a few groups' chains at a time.
_MAX_ASKS = 1000
_COLUMN = {kind: kind for kind in KINDS}  # kind → the quotas column holding its limit


@attrs.frozen
class SliceAsk:
    """One (group, kind) a holder wants re-leased or returned.

    ``close``: the holder's current grant for it (None if it has none); ``spent``: what it spent
    from that grant (the rest goes back). ``renew``: False to only return. ``need``: units waiting
    requests need now; ``keep``: concurrent slots in flight, which the new grant must include.
    """

    group_id: str
    kind: str
    close: str | None = None
    spent: int = 0
    renew: bool = True
    need: int = 0
    keep: int = 0


@attrs.frozen
class SliceGrant:
    """The answer for one ask. ``lease_id`` None with ``amount`` 0: nothing was free.
    ``limit`` None: the group has no limit of that kind (any more): spend without a slice.
    ``ttl`` seconds the grant may be spent for (by the database's clock); ``retry_after``: when
    enough of the limit frees up for ``need`` (seconds), if nothing was free."""

    group_id: str
    kind: str
    lease_id: str | None
    amount: int
    limit: int | None
    ttl: float
    holders: int
    retry_after: float | None = None


class QuotaSliceOps(OpsBase):
    async def lease_slices(self, holder: str, asks: Sequence[SliceAsk], *, ttl: float = 5.0) -> list[SliceGrant]:
        """Close and renew ``holder``'s slices for ``asks`` in one transaction; one grant per ask."""
        if not isinstance(holder, str) or not 0 < len(holder) <= 200:
            raise InvalidInput("holder", "must be a non-empty string")
        if len(asks) > _MAX_ASKS:
            raise InvalidInput("asks", f"at most {_MAX_ASKS} at once")
        for ask in asks:
            if ask.kind not in KINDS:
                raise InvalidInput("kind", f"must be one of {', '.join(KINDS)}")
        ttl_us = max(1, int(ttl * MICROS))
        return await self._write(lambda tx: _lease(tx, holder, list(asks), ttl_us))

    async def list_slices(self, group_id: str | None = None) -> list[tuple[str, str, str, int, int, int]]:
        """Live rows as (group_id, kind, holder, amount, expires_at µs, counts_until µs), for tests and
        the operator: what each daemon holds now."""

        def read(tx: Tx) -> list[tuple[str, str, str, int, int, int]]:
            sql = (
                "SELECT group_id, kind, holder, amount, expires_at, counts_until FROM quota_slices "
                "WHERE counts_until > now_us()"
            )
            rows = tx.rows(sql + " AND group_id = ?", (group_id,)) if group_id else tx.rows(sql)
            return sorted((str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in rows)

        return await self._read(read)


def _lease(tx: Tx, holder: str, asks: list[SliceAsk], ttl_us: int) -> list[SliceGrant]:
    row = tx.one("SELECT now_us()")
    assert row is not None
    now = int(row[0])
    group_ids = sorted({a.group_id for a in asks})
    if not group_ids:
        return []
    marks = ", ".join("?" * len(group_ids))
    if tx.dialect == "postgresql":
        # The serialisation point: every lease touching one of these groups waits here, in id
        # order (no deadlock between two daemons locking overlapping chains).
        tx.rows(f"SELECT id FROM tenant_groups WHERE id IN ({marks}) ORDER BY id FOR UPDATE", group_ids)
    # Rows that count no more are history; dropping them keeps the table at a few per holder.
    tx.run("DELETE FROM quota_slices WHERE counts_until <= ?", (now,))
    limits: dict[str, dict[str, int | None]] = {}
    for r in tx.rows(f"SELECT group_id, {', '.join(KINDS)} FROM quotas WHERE group_id IN ({marks})", group_ids):
        limits[str(r[0])] = dict(zip(KINDS, r[1:], strict=True))
    for ask in asks:
        if ask.close is not None:
            _close(tx, holder, ask, now)
    rows = tx.rows(
        f"SELECT group_id, kind, holder, amount, counts_until FROM quota_slices WHERE group_id IN ({marks})", group_ids
    )
    grants = []
    for ask in asks:
        limit = limits.get(ask.group_id, {}).get(_COLUMN[ask.kind])
        if not ask.renew or limit is None:
            grants.append(SliceGrant(ask.group_id, ask.kind, None, 0, limit, 0.0, 1))
            continue
        mine = [r for r in rows if r[0] == ask.group_id and r[1] == ask.kind]
        holders = len({r[2] for r in rows if r[0] == ask.group_id} | {holder})
        counted = sum(int(r[3]) for r in mine)
        amount = slice_amount(limit=int(limit), counted=counted, holders=holders, need=ask.need, keep=ask.keep)
        retry_after = None
        if amount < max(1, ask.need):
            retry_after = _seconds_until_free(mine, limit - max(1, ask.need), now)
        if amount <= 0:
            grants.append(SliceGrant(ask.group_id, ask.kind, None, 0, int(limit), 0.0, holders, retry_after))
            continue
        expires, counts_until = lease_times(ask.kind, now, ttl_us)
        lease_id = new_id()
        tx.run(
            "INSERT INTO quota_slices (id, group_id, kind, holder, amount, granted_at, expires_at, counts_until) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (lease_id, ask.group_id, ask.kind, holder, amount, now, expires, counts_until),
        )
        rows.append((ask.group_id, ask.kind, holder, amount, counts_until))
        grants.append(
            SliceGrant(
                ask.group_id, ask.kind, lease_id, amount, int(limit), (expires - now) / MICROS, holders, retry_after
            )
        )
    return grants


def _close(tx: Tx, holder: str, ask: SliceAsk, now: int) -> None:
    """Give back the unspent part of a grant; what was spent keeps counting for its window."""
    assert ask.close is not None
    if ask.kind == CONCURRENT:
        # Slots in flight move into the new grant (``keep``); the old row stops counting at once.
        tx.run("DELETE FROM quota_slices WHERE id = ? AND holder = ?", (ask.close, holder))
        return
    row = tx.one("SELECT amount, counts_until FROM quota_slices WHERE id = ? AND holder = ?", (ask.close, holder))
    if row is None:
        return  # already gone (its window passed): nothing to give back
    spent = max(0, int(ask.spent))
    if spent == 0:
        tx.run("DELETE FROM quota_slices WHERE id = ?", (ask.close,))
        return
    # A holder may have spent past its grant (tokens settled above their estimate): the row then
    # grows to the truth, so the others see the overdraft and lease less.
    tx.run(
        "UPDATE quota_slices SET amount = ?, expires_at = ?, counts_until = ? WHERE id = ?",
        (spent, now, closed_counts_until(ask.kind, now, int(row[1])), ask.close),
    )


def _seconds_until_free(rows: list[tuple[object, ...]], room: int, now: int) -> float:
    """How long until the rows counted for one (group, kind) fall to ``room`` or below."""
    counted = sum(int(str(r[3])) for r in rows)
    for amount, until in sorted(((int(str(r[3])), int(str(r[4]))) for r in rows), key=lambda p: p[1]):
        if counted <= room:
            break
        counted -= amount
        if counted <= room:
            return max(0.0, (until - now) / MICROS)
    return 1.0
