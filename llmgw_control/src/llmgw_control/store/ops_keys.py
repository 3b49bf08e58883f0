"""API keys, stored as caller-computed digests, with a revision counter for cheap refreshes.

The store never sees a key's secret: the tenancy code computes a keyed fast digest (an HMAC) and
passes that. Every control daemon serving traffic keeps the key table in memory and polls
``key_revision()`` (one tiny row) about every half second; when it moved, ``keys_changed_since``
returns only the keys changed since, and the ids of deleted ones, so a revocation reaches
every daemon within a second without reloading the whole table.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from . import convert as cv
from .audit_scope import note_change, record_fields
from .backend import Row, Tx
from .convert import UNSET, Unset
from .errors import Conflict, NotFound
from .ops_base import OpsBase, bump_revision, new_id
from .ops_groups import require_group
from .records import ApiKey, KeyChanges

_COLUMNS = "id, name, group_id, digest, models, admin, created_at, expires_at, revoked_at, revision"


def _key(row: Row) -> ApiKey:
    return ApiKey(
        id=row[0],
        name=row[1],
        group_id=row[2],
        digest=row[3],
        models=cv.load_models(row[4]),
        admin=bool(row[5]),
        created_at=cv.from_us(row[6]),
        expires_at=cv.opt_from_us(row[7]),
        revoked_at=cv.opt_from_us(row[8]),
        revision=int(row[9]),
    )


def _fields(key: ApiKey) -> dict[str, object]:
    # The digest is withheld (see audit_scope.SECRET_FIELD); the revision is bookkeeping.
    return record_fields(key, leave_out=("digest", "revision"))


def _get(tx: Tx, key_id: str) -> ApiKey:
    row = tx.one(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?", (key_id,))
    if row is None:
        raise NotFound("key", key_id)
    return _key(row)


class KeyOps(OpsBase):
    async def create_key(
        self,
        *,
        name: str,
        group_id: str,
        digest: str,
        models: Sequence[str] | None = None,
        admin: bool = False,
        expires_at: datetime | None = None,
        key_id: str | None = None,
    ) -> ApiKey:
        """Store a new key; ``Conflict`` if the digest (or a given id) already exists."""
        name = cv.name("name", name)
        group_id = cv.name("group_id", group_id)
        digest = cv.name("digest", digest, max_len=512)
        models_json = cv.model_list("models", models)
        admin = cv.flag("admin", admin)
        expires = cv.opt_to_us("expires_at", expires_at)
        kid = new_id() if key_id is None else cv.name("key_id", key_id)

        def create(tx: Tx) -> ApiKey:
            revision = bump_revision(tx, "keys")
            require_group(tx, group_id, "group_id")
            if tx.one("SELECT 1 FROM api_keys WHERE id = ?", (kid,)) is not None:
                raise Conflict(f"key {kid!r} already exists", field="key_id")
            if tx.one("SELECT 1 FROM api_keys WHERE digest = ?", (digest,)) is not None:
                raise Conflict("a key with this digest already exists", field="digest")
            # A deleted id that comes back is live again: drop its tombstone.
            tx.run("DELETE FROM deleted_keys WHERE id = ?", (kid,))
            row = tx.one(
                f"INSERT INTO api_keys ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, now_us(), ?, NULL, ?) "
                f"RETURNING {_COLUMNS}",
                (kid, name, group_id, digest, models_json, admin, expires, revision),
            )
            assert row is not None
            key = _key(row)
            note_change("key", key.id, None, _fields(key))
            return key

        return await self._write(create)

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
        """Change what was passed; ``models=None`` allows every model, ``expires_at=None`` never."""
        key_id = cv.name("key_id", key_id)
        sets: list[str] = []
        params: list[object] = []
        new_group: str | None = None
        if not isinstance(name, Unset):
            sets.append("name = ?")
            params.append(cv.name("name", name))
        if not isinstance(group_id, Unset):
            new_group = cv.name("group_id", group_id)
            sets.append("group_id = ?")
            params.append(new_group)
        if not isinstance(models, Unset):
            sets.append("models = ?")
            params.append(cv.model_list("models", models))
        if not isinstance(admin, Unset):
            sets.append("admin = ?")
            params.append(cv.flag("admin", admin))
        if not isinstance(expires_at, Unset):
            sets.append("expires_at = ?")
            params.append(cv.opt_to_us("expires_at", expires_at))

        def update(tx: Tx) -> ApiKey:
            revision = bump_revision(tx, "keys")
            before = _get(tx, key_id)
            if new_group is not None:
                require_group(tx, new_group, "group_id")
            row = tx.one(
                f"UPDATE api_keys SET {', '.join([*sets, 'revision = ?'])} WHERE id = ? RETURNING {_COLUMNS}",
                (*params, revision, key_id),
            )
            assert row is not None
            key = _key(row)
            note_change("key", key.id, _fields(before), _fields(key))
            return key

        return await self._write(update)

    async def revoke_key(self, key_id: str) -> ApiKey:
        """Mark a key revoked (now); revoking a revoked key keeps the first revocation time."""
        key_id = cv.name("key_id", key_id)

        def revoke(tx: Tx) -> ApiKey:
            revision = bump_revision(tx, "keys")
            key = _get(tx, key_id)
            if key.revoked_at is not None:
                return key
            row = tx.one(
                f"UPDATE api_keys SET revoked_at = now_us(), revision = ? WHERE id = ? RETURNING {_COLUMNS}",
                (revision, key_id),
            )
            assert row is not None
            revoked = _key(row)
            note_change("key", key_id, _fields(key), _fields(revoked))
            return revoked

        return await self._write(revoke)

    async def delete_key(self, key_id: str) -> None:
        """Remove a key for good (revoke it first if daemons should see why); leaves a tombstone."""
        key_id = cv.name("key_id", key_id)

        def delete(tx: Tx) -> None:
            revision = bump_revision(tx, "keys")
            before = _get(tx, key_id)
            tx.run("DELETE FROM api_keys WHERE id = ?", (key_id,))
            note_change("key", key_id, _fields(before), None)
            tx.run(
                "INSERT INTO deleted_keys (id, revision) VALUES (?, ?) "
                "ON CONFLICT (id) DO UPDATE SET revision = excluded.revision",
                (key_id, revision),
            )

        await self._write(delete)

    async def get_key(self, key_id: str) -> ApiKey:
        key_id = cv.name("key_id", key_id)
        return await self._read(lambda tx: _get(tx, key_id))

    async def key_by_digest(self, digest: str) -> ApiKey | None:
        """The key with this digest, revoked or expired ones included (the caller decides)."""
        digest = cv.name("digest", digest, max_len=512)

        def lookup(tx: Tx) -> ApiKey | None:
            row = tx.one(f"SELECT {_COLUMNS} FROM api_keys WHERE digest = ?", (digest,))
            return None if row is None else _key(row)

        return await self._read(lookup)

    async def list_keys(self, group_id: str | None = None) -> list[ApiKey]:
        gid = None if group_id is None else cv.name("group_id", group_id)

        def list_all(tx: Tx) -> list[ApiKey]:
            if gid is None:
                rows = tx.rows(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at, id")
            else:
                rows = tx.rows(f"SELECT {_COLUMNS} FROM api_keys WHERE group_id = ? ORDER BY created_at, id", (gid,))
            return [_key(r) for r in rows]

        return await self._read(list_all)

    async def key_revision(self) -> int:
        """The keys' change counter: one indexed row, cheap enough to poll twice a second."""

        def read(tx: Tx) -> int:
            row = tx.one("SELECT value FROM revisions WHERE kind = 'keys'")
            assert row is not None
            return int(row[0])

        return await self._read(read)

    async def keys_changed_since(self, marker: int) -> KeyChanges:
        """Keys created/changed/revoked and ids deleted after ``marker``.

        With ``marker`` 0 (or one ahead of the store, after a restore) ``reset`` is true and
        ``changed`` is the whole table: replace the in-memory table instead of merging.

        Pass the returned ``revision`` as the next marker. Writers take the counter's row lock
        until they commit, so revisions become visible in order and none is skipped.
        """
        marker = cv.count("marker", marker)

        def changes(tx: Tx) -> KeyChanges:
            row = tx.one("SELECT value FROM revisions WHERE kind = 'keys'")
            assert row is not None
            revision = int(row[0])
            # A marker from the future means the database was replaced (restored from a backup):
            # hand out the whole table and tell the caller to replace, not merge.
            since = 0 if marker > revision else marker
            changed = [
                _key(r)
                for r in tx.rows(f"SELECT {_COLUMNS} FROM api_keys WHERE revision > ? ORDER BY revision", (since,))
            ]
            deleted = (
                []
                if since == 0
                else [r[0] for r in tx.rows("SELECT id FROM deleted_keys WHERE revision > ? ORDER BY id", (since,))]
            )
            # Rows committed after the counter was read can be newer than it; never go backwards.
            top = max([revision, *(k.revision for k in changed)])
            return KeyChanges(revision=top, changed=tuple(changed), deleted=tuple(deleted), reset=since == 0)

        return await self._read(changes)
