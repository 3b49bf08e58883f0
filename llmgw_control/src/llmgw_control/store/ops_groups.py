"""The group tree: any depth, names unique among siblings, no cycles."""

from __future__ import annotations

from . import convert as cv
from .audit_scope import note_change, record_fields
from .backend import Row, Tx
from .convert import UNSET, Unset
from .errors import Conflict, InvalidInput, NotFound
from .ops_base import ONE_CLOCK, OpsBase, bump_revision, new_id
from .records import Group

_COLUMNS = "id, name, parent_id, created_at, updated_at, priority"

# The group itself and everything below it. Both databases support WITH RECURSIVE; the tree
# is acyclic by construction (update_group refuses cycles), so the recursion terminates.
SUBTREE_CTE = """WITH RECURSIVE subtree(id) AS (
    SELECT id FROM tenant_groups WHERE id = ?
    UNION ALL
    SELECT g.id FROM tenant_groups g JOIN subtree s ON g.parent_id = s.id)"""


def _group(row: Row) -> Group:
    return Group(
        id=row[0],
        name=row[1],
        parent_id=row[2],
        created_at=cv.from_us(row[3]),
        updated_at=cv.from_us(row[4]),
        priority=row[5],
    )


def require_group(tx: Tx, group_id: str, field: str) -> None:
    """A reference to a group (a parent, a key's group) must name one that exists."""
    if tx.one("SELECT 1 FROM tenant_groups WHERE id = ?", (group_id,)) is None:
        raise InvalidInput(field, f"group {group_id!r} does not exist")


def _check_sibling_name(tx: Tx, name: str, parent_id: str | None, exclude: str | None) -> None:
    row = tx.one(
        "SELECT id FROM tenant_groups WHERE COALESCE(parent_id, '') = ? AND name = ? AND id <> ?",
        (parent_id or "", name, exclude or ""),
    )
    if row is not None:
        where = f"under {parent_id!r}" if parent_id else "at the root"
        raise Conflict(f"a group named {name!r} already exists {where}", field="name")


class GroupOps(OpsBase):
    async def create_group(
        self, name: str, parent_id: str | None = None, *, group_id: str | None = None, priority: str | None = None
    ) -> Group:
        """Add a group under ``parent_id`` (None: a root); the id is generated unless given.
        ``priority`` None: inherited from the parent."""
        name = cv.name("name", name)
        parent = None if parent_id is None else cv.name("parent_id", parent_id)
        gid = new_id() if group_id is None else cv.name("group_id", group_id)
        klass = cv.priority("priority", priority)

        def create(tx: Tx) -> Group:
            bump_revision(tx, "groups")
            if tx.one("SELECT 1 FROM tenant_groups WHERE id = ?", (gid,)) is not None:
                raise Conflict(f"group {gid!r} already exists", field="group_id")
            if parent is not None:
                require_group(tx, parent, "parent_id")
            _check_sibling_name(tx, name, parent, None)
            row = tx.one(
                f"INSERT INTO tenant_groups ({_COLUMNS}) SELECT ?, ?, ?, clock.t, clock.t, ? FROM {ONE_CLOCK} "
                f"RETURNING {_COLUMNS}",
                (gid, name, parent, klass),
            )
            assert row is not None
            group = _group(row)
            note_change("group", group.id, None, record_fields(group))
            return group

        return await self._write(create)

    async def update_group(
        self,
        group_id: str,
        *,
        name: str | Unset = UNSET,
        parent_id: str | Unset | None = UNSET,
        priority: str | Unset | None = UNSET,
    ) -> Group:
        """Rename, move (``parent_id=None`` makes it a root; refuses cycles) and/or set the priority
        (``priority=None``: inherit the parent's) of a group."""
        group_id = cv.name("group_id", group_id)
        new_name = UNSET if isinstance(name, Unset) else cv.name("name", name)
        new_priority = UNSET if isinstance(priority, Unset) else cv.priority("priority", priority)
        new_parent: str | Unset | None = parent_id
        if isinstance(parent_id, str):
            new_parent = cv.name("parent_id", parent_id)

        def update(tx: Tx) -> Group:
            bump_revision(tx, "groups")
            row = tx.one(f"SELECT {_COLUMNS} FROM tenant_groups WHERE id = ?", (group_id,))
            if row is None:
                raise NotFound("group", group_id)
            current = _group(row)
            target_name = current.name if isinstance(new_name, Unset) else new_name
            target_parent = current.parent_id if isinstance(new_parent, Unset) else new_parent
            if target_parent is not None and target_parent != current.parent_id:
                require_group(tx, target_parent, "parent_id")
                below = {r[0] for r in tx.rows(f"{SUBTREE_CTE} SELECT id FROM subtree", (group_id,))}
                if target_parent in below:
                    raise Conflict(
                        f"parent_id: moving group {group_id!r} under {target_parent!r} would make a cycle",
                        field="parent_id",
                    )
            _check_sibling_name(tx, target_name, target_parent, group_id)
            target_priority = current.priority if isinstance(new_priority, Unset) else new_priority
            row = tx.one(
                f"UPDATE tenant_groups SET name = ?, parent_id = ?, priority = ?, updated_at = now_us() WHERE id = ? "
                f"RETURNING {_COLUMNS}",
                (target_name, target_parent, target_priority, group_id),
            )
            assert row is not None
            group = _group(row)
            note_change("group", group_id, record_fields(current), record_fields(group))
            return group

        return await self._write(update)

    async def delete_group(self, group_id: str) -> None:
        """Delete a leaf group without keys (its quota goes with it); ``Conflict`` otherwise."""
        group_id = cv.name("group_id", group_id)

        def delete(tx: Tx) -> None:
            bump_revision(tx, "groups")
            # Taking the key counter too keeps a concurrent create_key from slipping a key into
            # the group between the check and the delete (the foreign key would catch it, less
            # clearly).
            bump_revision(tx, "keys")
            bump_revision(tx, "quotas")
            row = tx.one(f"SELECT {_COLUMNS} FROM tenant_groups WHERE id = ?", (group_id,))
            if row is None:
                raise NotFound("group", group_id)
            if tx.one("SELECT 1 FROM tenant_groups WHERE parent_id = ?", (group_id,)) is not None:
                raise Conflict(f"group {group_id!r} still has child groups; delete or move them first")
            if tx.one("SELECT 1 FROM api_keys WHERE group_id = ?", (group_id,)) is not None:
                raise Conflict(f"group {group_id!r} still has API keys; delete or move them first")
            if tx.run("DELETE FROM quotas WHERE group_id = ?", (group_id,)):
                note_change("quota", group_id, {"group_id": group_id}, None)
            tx.run("DELETE FROM tenant_groups WHERE id = ?", (group_id,))
            note_change("group", group_id, record_fields(_group(row)), None)

        await self._write(delete)

    async def get_group(self, group_id: str) -> Group:
        group_id = cv.name("group_id", group_id)

        def get(tx: Tx) -> Group:
            row = tx.one(f"SELECT {_COLUMNS} FROM tenant_groups WHERE id = ?", (group_id,))
            if row is None:
                raise NotFound("group", group_id)
            return _group(row)

        return await self._read(get)

    async def list_groups(self) -> list[Group]:
        """Every group, parents before children is *not* guaranteed: build the tree by id."""

        def list_all(tx: Tx) -> list[Group]:
            return [_group(r) for r in tx.rows(f"SELECT {_COLUMNS} FROM tenant_groups ORDER BY name, id")]

        return await self._read(list_all)

    async def group_subtree(self, group_id: str) -> list[str]:
        """The ids of ``group_id`` and all its descendants."""
        group_id = cv.name("group_id", group_id)

        def subtree(tx: Tx) -> list[str]:
            ids = [r[0] for r in tx.rows(f"{SUBTREE_CTE} SELECT id FROM subtree", (group_id,))]
            if not ids:
                raise NotFound("group", group_id)
            return sorted(ids)

        return await self._read(subtree)
