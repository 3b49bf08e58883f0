"""Capacity records: benchmark results kept as history (no foreign keys to nodes or models)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from . import convert as cv
from .audit_scope import note_change, record_fields
from .backend import Row, Tx
from .errors import InvalidInput, NotFound
from .ops_base import ONE_CLOCK, OpsBase, new_id
from .records import CapacityRecord, CapacityRunRecord

_COLUMNS = "id, model, profile, node_id, engine, concurrency, tokens_per_s, ttft_p50_s, ttft_p99_s, measured_at, detail"


_RUN_COLUMNS = "id, model, profile, node_id, kind, state, created_at, updated_at, document"
RUN_STATES = ("queued", "running", "done", "failed", "cancelled")


def _state(value: object) -> str:
    if value not in RUN_STATES:
        raise InvalidInput("state", f"must be one of {', '.join(RUN_STATES)}")
    return str(value)


def _run(row: Row) -> CapacityRunRecord:
    return CapacityRunRecord(
        id=row[0],
        model=row[1],
        profile=row[2],
        node_id=row[3],
        kind=row[4],
        state=row[5],
        created_at=cv.from_us(row[6]),
        updated_at=cv.from_us(row[7]),
        document=cv.load_json(row[8]),
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
            record = _record(row)
            note_change("capacity", record.id, None, record_fields(record))
            return record

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
            note_change("capacity", record_id, {"id": record_id}, None)

        await self._write(delete)

    # ------------------------------------------------------------------ runs

    async def add_capacity_run(
        self,
        *,
        model: str,
        profile: str,
        node_id: str,
        kind: str,
        state: str,
        document: Mapping[str, Any],
    ) -> CapacityRunRecord:
        values = (
            new_id(),
            cv.name("model", model),
            cv.name("profile", profile),
            cv.text("node_id", node_id, max_len=cv.MAX_NAME),
            cv.text("kind", kind),
            _state(state),
            cv.json_object("document", document),
        )

        def add(tx: Tx) -> CapacityRunRecord:
            row = tx.one(
                f"INSERT INTO capacity_runs ({_RUN_COLUMNS}) SELECT ?, ?, ?, ?, ?, ?, clock.t, clock.t, ? "
                f"FROM {ONE_CLOCK} RETURNING {_RUN_COLUMNS}",
                values,
            )
            assert row is not None
            run = _run(row)
            note_change("capacity_run", run.id, None, record_fields(run, leave_out=("created_at", "updated_at")))
            return run

        return await self._write(add)

    async def update_capacity_run(
        self,
        run_id: str,
        *,
        state: str,
        document: Mapping[str, Any],
        node_id: str | None = None,
        kind: str | None = None,
    ) -> CapacityRunRecord:
        run_id = cv.name("run_id", run_id)
        sets = ["state = ?", "document = ?", "updated_at = now_us()"]
        params: list[object] = [_state(state), cv.json_object("document", document)]
        if node_id is not None:
            sets.append("node_id = ?")
            params.append(cv.text("node_id", node_id, max_len=cv.MAX_NAME))
        if kind is not None:
            sets.append("kind = ?")
            params.append(cv.text("kind", kind))
        params.append(run_id)

        def update(tx: Tx) -> CapacityRunRecord:
            old = tx.one(f"SELECT {_RUN_COLUMNS} FROM capacity_runs WHERE id = ?", (run_id,))
            row = tx.one(f"UPDATE capacity_runs SET {', '.join(sets)} WHERE id = ? RETURNING {_RUN_COLUMNS}", params)
            if row is None or old is None:
                raise NotFound("capacity run", run_id)
            run = _run(row)
            skip = ("created_at", "updated_at")
            note_change(
                "capacity_run", run_id, record_fields(_run(old), leave_out=skip), record_fields(run, leave_out=skip)
            )
            return run

        return await self._write(update)

    async def get_capacity_run(self, run_id: str) -> CapacityRunRecord:
        run_id = cv.name("run_id", run_id)

        def get(tx: Tx) -> CapacityRunRecord:
            row = tx.one(f"SELECT {_RUN_COLUMNS} FROM capacity_runs WHERE id = ?", (run_id,))
            if row is None:
                raise NotFound("capacity run", run_id)
            return _run(row)

        return await self._read(get)

    async def list_capacity_runs(
        self,
        *,
        model: str | None = None,
        profile: str | None = None,
        state: str | None = None,
        limit: int = 100,
    ) -> list[CapacityRunRecord]:
        """Runs matching every filter given, newest first, at most ``limit``."""
        where: list[str] = []
        params: list[object] = []
        for column, value in (("model", model), ("profile", profile)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(cv.name(column, value))
        if state is not None:
            where.append("state = ?")
            params.append(_state(state))
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        params.append(cv.count("limit", limit, minimum=1))

        def list_all(tx: Tx) -> list[CapacityRunRecord]:
            rows = tx.rows(
                f"SELECT {_RUN_COLUMNS} FROM capacity_runs{clause} ORDER BY created_at DESC, id LIMIT ?", params
            )
            return [_run(r) for r in rows]

        return await self._read(list_all)
