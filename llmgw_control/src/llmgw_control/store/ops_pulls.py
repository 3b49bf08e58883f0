"""The model mirror's pulls: one JSON document per pull (its source, state and draft model).

Progress (bytes, rate) is kept in memory by the daemon doing the download; the store holds what
must outlive it: what was asked, how it ended, and the draft catalog entry waiting to be published.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import convert as cv
from .audit_scope import note_change
from .backend import Tx
from .errors import NotFound
from .ops_base import OpsBase


class PullOps(OpsBase):
    async def put_pull(self, pull_id: str, document: Mapping[str, Any]) -> None:
        """Insert or replace a pull's document."""
        pull_id = cv.name("id", pull_id)
        doc = cv.json_object("document", document)

        def put(tx: Tx) -> None:
            old = tx.one("SELECT document FROM model_pulls WHERE id = ?", (pull_id,))
            tx.run(
                "INSERT INTO model_pulls (id, document, created_at, updated_at) VALUES (?, ?, now_us(), now_us()) "
                "ON CONFLICT (id) DO UPDATE SET document = excluded.document, updated_at = excluded.updated_at",
                (pull_id, doc),
            )
            note_change("pull", pull_id, None if old is None else cv.load_json(old[0]), dict(document))

        await self._write(put)

    async def list_pulls(self) -> list[dict[str, Any]]:
        def read(tx: Tx) -> list[dict[str, Any]]:
            return [cv.load_json(r[0]) for r in tx.rows("SELECT document FROM model_pulls ORDER BY created_at, id")]

        return await self._read(read)

    async def delete_pull(self, pull_id: str) -> None:
        pull_id = cv.name("id", pull_id)

        def delete(tx: Tx) -> None:
            if tx.run("DELETE FROM model_pulls WHERE id = ?", (pull_id,)) == 0:
                raise NotFound("pull", pull_id)
            note_change("pull", pull_id, {"id": pull_id}, None)

        await self._write(delete)
