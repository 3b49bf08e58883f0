"""Usage per (hour, key, group, model), written in batches by adding, read with filters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack

from . import convert as cv
from .backend import Row, Tx
from .errors import InvalidInput
from .ops_base import OpsBase
from .ops_groups import SUBTREE_CTE
from .records import Usage, UsageQuery, UsageTotals

_HOUR_US = 3600 * 1_000_000
_COUNTS = "requests, prompt_tokens, completion_tokens"


def _usage(row: Row) -> Usage:
    return Usage(
        hour=cv.from_us(row[0]),
        key_id=row[1],
        group_id=row[2],
        model=row[3],
        requests=int(row[4]),
        prompt_tokens=int(row[5]),
        completion_tokens=int(row[6]),
    )


def _merge(deltas: Sequence[Usage]) -> list[tuple[int, str, str, str, int, int, int]]:
    """Validate the batch and fold duplicates, so each row is upserted once, in a fixed order.

    The fixed order matters on PostgreSQL: two daemons flushing overlapping batches lock rows in
    the same order and cannot deadlock.
    """
    merged: dict[tuple[int, str, str, str], list[int]] = {}
    for i, d in enumerate(deltas):
        if not isinstance(d, Usage):
            raise InvalidInput(f"deltas[{i}]", "must be a Usage")
        hour = cv.to_us(f"deltas[{i}].hour", d.hour) // _HOUR_US * _HOUR_US
        key = (
            hour,
            cv.text(f"deltas[{i}].key_id", d.key_id),
            cv.text(f"deltas[{i}].group_id", d.group_id),
            cv.name(f"deltas[{i}].model", d.model),
        )
        counts = merged.setdefault(key, [0, 0, 0])
        counts[0] += cv.count(f"deltas[{i}].requests", d.requests)
        counts[1] += cv.count(f"deltas[{i}].prompt_tokens", d.prompt_tokens)
        counts[2] += cv.count(f"deltas[{i}].completion_tokens", d.completion_tokens)
    return [(k[0], k[1], k[2], k[3], v[0], v[1], v[2]) for k, v in sorted(merged.items())]


class UsageOps(OpsBase):
    async def add_usage(self, deltas: Sequence[Usage]) -> None:
        """Add a batch of usage deltas, all in one transaction (all or nothing)."""
        rows = _merge(deltas)
        if not rows:
            return

        def add(tx: Tx) -> None:
            for row in rows:
                tx.run(
                    f"INSERT INTO usage_hourly (hour, key_id, group_id, model, {_COUNTS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (hour, key_id, group_id, model) DO UPDATE SET "
                    "requests = usage_hourly.requests + excluded.requests, "
                    "prompt_tokens = usage_hourly.prompt_tokens + excluded.prompt_tokens, "
                    "completion_tokens = usage_hourly.completion_tokens + excluded.completion_tokens",
                    row,
                )

        await self._write(add)

    @staticmethod
    def _filters(query: UsageQuery) -> tuple[str, str, list[object]]:
        group_id, key_id, model = query.get("group_id"), query.get("key_id"), query.get("model")
        since, until = query.get("since"), query.get("until")
        include_descendants = query.get("include_descendants", False)
        cte = ""
        where: list[str] = []
        params: list[object] = []
        if group_id is not None:
            gid = cv.text("group_id", group_id)
            if cv.flag("include_descendants", include_descendants):
                cte = SUBTREE_CTE
                params.append(gid)
                where.append("group_id IN (SELECT id FROM subtree)")
            else:
                where.append("group_id = ?")
                params.append(gid)
        if key_id is not None:
            where.append("key_id = ?")
            params.append(cv.text("key_id", key_id))
        if model is not None:
            where.append("model = ?")
            params.append(cv.name("model", model))
        # Hour buckets: since is inclusive of the hour it falls in, until is exclusive.
        if since is not None:
            where.append("hour >= ?")
            params.append(cv.to_us("since", since) // _HOUR_US * _HOUR_US)
        if until is not None:
            where.append("hour < ?")
            params.append(cv.to_us("until", until))
        return cte, (" WHERE " + " AND ".join(where)) if where else "", params

    async def query_usage(self, **query: Unpack[UsageQuery]) -> list[Usage]:
        """Hourly rows matching every filter given; ``since`` rounds down to its hour, ``until``
        is exclusive. With ``include_descendants`` a group's usage includes its whole subtree."""
        cte, where, params = self._filters(query)

        def select(tx: Tx) -> list[Usage]:
            rows = tx.rows(
                f"{cte} SELECT hour, key_id, group_id, model, {_COUNTS} FROM usage_hourly{where} "
                "ORDER BY hour, group_id, key_id, model",
                params,
            )
            return [_usage(r) for r in rows]

        return await self._read(select)

    async def usage_totals(self, **query: Unpack[UsageQuery]) -> UsageTotals:
        """The sums over what ``query_usage`` would return with the same filters."""
        cte, where, params = self._filters(query)

        def total(tx: Tx) -> UsageTotals:
            row = tx.one(
                f"{cte} SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(prompt_tokens), 0), "
                f"COALESCE(SUM(completion_tokens), 0) FROM usage_hourly{where}",
                params,
            )
            assert row is not None
            return UsageTotals(int(row[0]), int(row[1]), int(row[2]))

        return await self._read(total)
