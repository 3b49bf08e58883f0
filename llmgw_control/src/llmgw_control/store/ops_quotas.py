"""Quotas per group; enforcement happens in memory (tenancy), the store only keeps the limits."""

from __future__ import annotations

from . import convert as cv
from .audit_scope import note_change, record_fields
from .backend import Row, Tx
from .errors import InvalidInput, NotFound
from .ops_base import OpsBase, bump_revision
from .records import Quota

_LIMITS = "requests_per_minute, tokens_per_minute, tokens_per_day, concurrent_requests"


def _quota(row: Row) -> Quota:
    return Quota(
        requests_per_minute=row[0], tokens_per_minute=row[1], tokens_per_day=row[2], concurrent_requests=row[3]
    )


class QuotaOps(OpsBase):
    async def set_quota(self, group_id: str, quota: Quota) -> Quota:
        """Create or replace a group's limits (a limit left None is no limit)."""
        group_id = cv.name("group_id", group_id)
        if not isinstance(quota, Quota):
            raise InvalidInput("quota", "must be a Quota")
        limits = (
            cv.opt_count("requests_per_minute", quota.requests_per_minute),
            cv.opt_count("tokens_per_minute", quota.tokens_per_minute),
            cv.opt_count("tokens_per_day", quota.tokens_per_day),
            cv.opt_count("concurrent_requests", quota.concurrent_requests),
        )

        def set_(tx: Tx) -> Quota:
            bump_revision(tx, "quotas")
            if tx.one("SELECT 1 FROM tenant_groups WHERE id = ?", (group_id,)) is None:
                raise NotFound("group", group_id)
            old = tx.one(f"SELECT {_LIMITS} FROM quotas WHERE group_id = ?", (group_id,))
            row = tx.one(
                f"INSERT INTO quotas (group_id, {_LIMITS}, updated_at) VALUES (?, ?, ?, ?, ?, now_us()) "
                "ON CONFLICT (group_id) DO UPDATE SET requests_per_minute = excluded.requests_per_minute, "
                "tokens_per_minute = excluded.tokens_per_minute, tokens_per_day = excluded.tokens_per_day, "
                "concurrent_requests = excluded.concurrent_requests, updated_at = excluded.updated_at "
                f"RETURNING {_LIMITS}",
                (group_id, *limits),
            )
            assert row is not None
            quota = _quota(row)
            note_change("quota", group_id, None if old is None else record_fields(_quota(old)), record_fields(quota))
            return quota

        return await self._write(set_)

    async def get_quota(self, group_id: str) -> Quota | None:
        """The group's limits, or None when it has none; ``NotFound`` for an unknown group."""
        group_id = cv.name("group_id", group_id)

        def get(tx: Tx) -> Quota | None:
            require_group_found(tx, group_id)
            row = tx.one(f"SELECT {_LIMITS} FROM quotas WHERE group_id = ?", (group_id,))
            return None if row is None else _quota(row)

        return await self._read(get)

    async def delete_quota(self, group_id: str) -> None:
        group_id = cv.name("group_id", group_id)

        def delete(tx: Tx) -> None:
            bump_revision(tx, "quotas")
            old = tx.one(f"SELECT {_LIMITS} FROM quotas WHERE group_id = ?", (group_id,))
            if old is None:
                raise NotFound("quota", group_id)
            tx.run("DELETE FROM quotas WHERE group_id = ?", (group_id,))
            note_change("quota", group_id, record_fields(_quota(old)), None)

        await self._write(delete)

    async def list_quotas(self) -> dict[str, Quota]:
        """Every group's limits by group id (groups without a quota are absent)."""

        def list_all(tx: Tx) -> dict[str, Quota]:
            rows = tx.rows(f"SELECT group_id, {_LIMITS} FROM quotas ORDER BY group_id")
            return {r[0]: _quota(r[1:]) for r in rows}

        return await self._read(list_all)


def require_group_found(tx: Tx, group_id: str) -> None:
    if tx.one("SELECT 1 FROM tenant_groups WHERE id = ?", (group_id,)) is None:
        raise NotFound("group", group_id)
