"""Schema migrations: applied once, in order, atomically; a newer schema is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from llmgw_control.store import (
    MIGRATIONS,
    Migration,
    PostgresStore,
    SchemaTooNew,
    SqliteStore,
    SqlStore,
    StoreError,
    connect_store,
    is_postgres_url,
    latest_version,
)
from llmgw_control.store.backend import Tx


async def _open(url: str, steps: tuple[Migration, ...]) -> SqlStore:
    if is_postgres_url(url):
        return await PostgresStore.open(url, migration_steps=steps)
    return await SqliteStore.open(url, migration_steps=steps)


def _versions(tx: Tx) -> list[int]:
    return [int(r[0]) for r in tx.rows("SELECT version FROM schema_version ORDER BY version")]


async def test_fresh_database_gets_every_step_once(store_url: str) -> None:
    async with await connect_store(store_url) as store:
        await store.add_model("m", {})
    async with await connect_store(store_url) as store:
        assert await store.backend.run(_versions, write=False) == list(range(1, latest_version() + 1))
        assert [m.name for m in await store.list_models()] == ["m"]


async def test_newer_schema_is_refused_with_a_clear_message(store_url: str) -> None:
    async with await connect_store(store_url) as store:
        await store.backend.run(
            lambda tx: tx.run(
                "INSERT INTO schema_version (version, description, applied_at) VALUES (?, 'from the future', 0)",
                (latest_version() + 1,),
            ),
            write=True,
        )
    with pytest.raises(SchemaTooNew, match=r"schema is version \d+, but this llmgw knows versions up to") as info:
        await connect_store(store_url)
    assert info.value.found == latest_version() + 1
    assert "newer llmgw" in str(info.value)


async def test_a_new_step_is_applied_on_open(store_url: str) -> None:
    first = await connect_store(store_url)
    await first.add_model("kept", {"a": 1})
    await first.aclose()
    extra = Migration(
        latest_version() + 1,
        "add a column",
        ("ALTER TABLE catalog_models ADD COLUMN note TEXT", "UPDATE catalog_models SET note = 'migrated'"),
    )
    async with await _open(store_url, (*MIGRATIONS, extra)) as store:
        assert await store.schema_version() == extra.version
        notes = await store.backend.run(lambda tx: tx.rows("SELECT name, note FROM catalog_models"), write=False)
        assert [tuple(r) for r in notes] == [("kept", "migrated")]
    # The older code now refuses the database it no longer understands.
    with pytest.raises(SchemaTooNew):
        await connect_store(store_url)


async def test_a_failing_step_leaves_nothing_behind(store_url: str) -> None:
    async with await connect_store(store_url):
        pass
    broken = Migration(
        latest_version() + 1,
        "half a step",
        ("CREATE TABLE half_done (id TEXT PRIMARY KEY)", "INSERT INTO no_such_table VALUES (1)"),
    )
    with pytest.raises(StoreError):
        await _open(store_url, (*MIGRATIONS, broken))
    async with await connect_store(store_url) as store:
        assert await store.schema_version() == latest_version()
        # The DDL of the failed step was rolled back with it (both databases have transactional DDL).
        await store.backend.run(lambda tx: tx.run("CREATE TABLE half_done (id TEXT PRIMARY KEY)"), write=True)


async def test_daemons_starting_together_migrate_once(store_url: str) -> None:
    opened: list[SqlStore] = []

    async def open_one() -> None:
        opened.append(await connect_store(store_url))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(open_one)
    try:
        assert await opened[0].backend.run(_versions, write=False) == list(range(1, latest_version() + 1))
    finally:
        for store in opened:
            await store.aclose()


async def test_steps_must_be_numbered_in_order(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"1\.\.n"):
        await _open(str(tmp_path / "s.db"), (Migration(2, "gap", ()),))


async def test_groups_made_before_priorities_existed_inherit_after_the_upgrade(store_url: str) -> None:
    before = MIGRATIONS[:2]
    async with await _open(store_url, before) as old:
        await old.backend.run(
            lambda tx: tx.run(
                "INSERT INTO tenant_groups (id, name, parent_id, created_at, updated_at) "
                "VALUES ('g1', 'org', NULL, 0, 0)"
            ),
            write=True,
        )
    async with await connect_store(store_url) as store:
        (group,) = await store.list_groups()
        assert group.id == "g1" and group.priority is None
        assert (await store.update_group("g1", priority="batch")).priority == "batch"
