"""Catalog models added through the admin API (the config file's models never live here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import convert as cv
from .audit_scope import note_change
from .backend import Row, Tx
from .errors import Conflict, NotFound
from .ops_base import ONE_CLOCK, OpsBase, bump_revision
from .records import CatalogModel

_COLUMNS = "name, document, created_at, updated_at"


def _model(row: Row) -> CatalogModel:
    return CatalogModel(
        name=row[0], document=cv.load_json(row[1]), created_at=cv.from_us(row[2]), updated_at=cv.from_us(row[3])
    )


class CatalogOps(OpsBase):
    async def add_model(self, name: str, document: Mapping[str, Any]) -> CatalogModel:
        """Store a new model definition; ``Conflict`` if the name is taken."""
        name = cv.name("name", name)
        doc = cv.json_object("document", document)

        def add(tx: Tx) -> CatalogModel:
            bump_revision(tx, "models")
            if tx.one("SELECT 1 FROM catalog_models WHERE name = ?", (name,)) is not None:
                raise Conflict(f"model {name!r} already exists", field="name")
            row = tx.one(
                f"INSERT INTO catalog_models ({_COLUMNS}) SELECT ?, ?, clock.t, clock.t FROM {ONE_CLOCK} "
                f"RETURNING {_COLUMNS}",
                (name, doc),
            )
            assert row is not None
            model = _model(row)
            note_change("model", name, None, model.document)
            return model

        return await self._write(add)

    async def update_model(self, name: str, document: Mapping[str, Any]) -> CatalogModel:
        """Replace a stored model's definition; ``NotFound`` if there is none."""
        name = cv.name("name", name)
        doc = cv.json_object("document", document)

        def update(tx: Tx) -> CatalogModel:
            bump_revision(tx, "models")
            old = tx.one(f"SELECT {_COLUMNS} FROM catalog_models WHERE name = ?", (name,))
            row = tx.one(
                f"UPDATE catalog_models SET document = ?, updated_at = now_us() WHERE name = ? RETURNING {_COLUMNS}",
                (doc, name),
            )
            if row is None or old is None:
                raise NotFound("model", name)
            model = _model(row)
            note_change("model", name, _model(old).document, model.document)
            return model

        return await self._write(update)

    async def delete_model(self, name: str) -> None:
        name = cv.name("name", name)

        def delete(tx: Tx) -> None:
            bump_revision(tx, "models")
            old = tx.one(f"SELECT {_COLUMNS} FROM catalog_models WHERE name = ?", (name,))
            if old is None:
                raise NotFound("model", name)
            tx.run("DELETE FROM catalog_models WHERE name = ?", (name,))
            note_change("model", name, _model(old).document, None)

        await self._write(delete)

    async def get_model(self, name: str) -> CatalogModel:
        name = cv.name("name", name)

        def get(tx: Tx) -> CatalogModel:
            row = tx.one(f"SELECT {_COLUMNS} FROM catalog_models WHERE name = ?", (name,))
            if row is None:
                raise NotFound("model", name)
            return _model(row)

        return await self._read(get)

    async def list_models(self) -> list[CatalogModel]:
        def list_all(tx: Tx) -> list[CatalogModel]:
            return [_model(r) for r in tx.rows(f"SELECT {_COLUMNS} FROM catalog_models ORDER BY name")]

        return await self._read(list_all)
