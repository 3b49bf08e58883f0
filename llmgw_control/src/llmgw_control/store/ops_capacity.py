"""Capacity records: benchmark results kept as history (no foreign keys to nodes or models)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from . import convert as cv
from .backend import Row, Tx
from .errors import NotFound
from .ops_base import OpsBase, new_id
from .records import CapacityRecord

_COLUMNS = (
    "id, model, profile, node_id, engine, concurrency, tokens_per_s, ttft_p50_s, ttft_p99_s, measured_at, detail"
)


def _record(row: Row) -> CapacityRecord:
    return CapacityRecord(
        id=row[0],
        model=row[1],
        profile=row[2],
        node_id=row[3],
        engine=row[4],
        concurrency=int(row[5]),
        tokens_per_s=float(row[6]),
        ttft_p50_s=float(row[7]),
        ttft_p99_s=float(row[8]),
        measured_at=cv.from_us(row[9]),
        detail=cv.load_json(row[10]),
    )


class CapacityOps(OpsBase):
    async def add_capacity(
        self,
        *,
        model: str,
        profile: str,
        node_id: str,
        engine: str,
        concurrency: int,
        tokens_per_s: float,
        ttft_p50_s: float,
        ttft_p99_s: float,
        measured_at: datetime,
        detail: Mapping[str, Any] | None = None,
    ) -> CapacityRecord:
        values = (
            new_id(),
            cv.name("model", model),
            cv.name("profile", profile),
            cv.name("node_id", node_id),
            cv.name("engine", engine),
            cv.count("concurrency", concurrency, minimum=1),
            cv.number("tokens_per_s", tokens_per_s),
            cv.number("ttft_p50_s", ttft_p50_s),
            cv.number("ttft_p99_s", ttft_p99_s),
            cv.to_us("measured_at", measured_at),
            cv.json_object("detail", detail or {}),
        )

        def add(tx: Tx) -> CapacityRecord:
            row = tx.one(
                f"INSERT INTO capacity ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING {_COLUMNS}",
                values,
            )
            assert row is not None
            return _record(row)

        return await self._write(add)

    async def list_capacity(
        self,
        *,
        model: str | None = None,
        profile: str | None = None,
        node_id: str | None = None,
        engine: str | None = None,
    ) -> list[CapacityRecord]:
        """Records matching every filter given, newest first."""
        where: list[str] = []
        params: list[object] = []
        for column, value in (("model", model), ("profile", profile), ("node_id", node_id), ("engine", engine)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(cv.name(column, value))
        clause = (" WHERE " + " AND ".join(where)) if where else ""

        def list_all(tx: Tx) -> list[CapacityRecord]:
            rows = tx.rows(f"SELECT {_COLUMNS} FROM capacity{clause} ORDER BY measured_at DESC, id", params)
            return [_record(r) for r in rows]

        return await self._read(list_all)

    async def delete_capacity(self, record_id: str) -> None:
        record_id = cv.name("record_id", record_id)

        def delete(tx: Tx) -> None:
            if tx.run("DELETE FROM capacity WHERE id = ?", (record_id,)) == 0:
                raise NotFound("capacity record", record_id)

        await self._write(delete)
