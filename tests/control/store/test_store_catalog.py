"""Catalog models added through the API: CRUD, duplicates, bad input, survival across reopen."""

from __future__ import annotations

import pytest

from llmgw_control.store import Conflict, InvalidInput, NotFound, SqlStore, connect_store, latest_version

DOC = {"profiles": [{"name": "default", "engine": "llama.cpp", "args": ["-c", "4096"]}], "replicas": 1}


async def test_opens_at_latest_schema(store: SqlStore) -> None:
    assert await store.schema_version() == latest_version()


async def test_add_get_list(store: SqlStore) -> None:
    added = await store.add_model("qwen-0.5b", DOC)
    assert added.name == "qwen-0.5b"
    assert added.document == DOC
    assert added.created_at == added.updated_at
    assert added.created_at.tzinfo is not None
    assert await store.get_model("qwen-0.5b") == added
    await store.add_model("alpha", {"x": 1})
    assert [m.name for m in await store.list_models()] == ["alpha", "qwen-0.5b"]


async def test_duplicate_name_is_a_clear_conflict(store: SqlStore) -> None:
    await store.add_model("m", DOC)
    with pytest.raises(Conflict, match="model 'm' already exists") as info:
        await store.add_model("m", {"other": True})
    assert info.value.field == "name"
    assert (await store.get_model("m")).document == DOC


async def test_update_and_delete(store: SqlStore) -> None:
    added = await store.add_model("m", DOC)
    updated = await store.update_model("m", {"replicas": 2})
    assert updated.document == {"replicas": 2}
    assert updated.created_at == added.created_at
    assert updated.updated_at >= added.updated_at
    await store.delete_model("m")
    with pytest.raises(NotFound, match="model 'm' not found"):
        await store.get_model("m")
    with pytest.raises(NotFound):
        await store.update_model("m", DOC)
    with pytest.raises(NotFound):
        await store.delete_model("m")


@pytest.mark.parametrize(
    ("name", "document", "field"),
    [
        ("", DOC, "name"),
        (" padded", DOC, "name"),
        ("x" * 201, DOC, "name"),
        ("m", ["not", "an", "object"], "document"),
        ("m", {"nan": float("nan")}, "document"),
        ("m", {"obj": object()}, "document"),
    ],
)
async def test_bad_input_names_the_field(store: SqlStore, name: str, document: object, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        await store.add_model(name, document)  # type: ignore[arg-type]
    assert info.value.field == field
    assert await store.list_models() == []


async def test_models_survive_reopen(store_url: str) -> None:
    async with await connect_store(store_url) as first:
        await first.add_model("kept", DOC)
    async with await connect_store(store_url) as second:
        assert (await second.get_model("kept")).document == DOC
        assert await second.schema_version() == latest_version()


async def test_revision_moves_on_every_change(store: SqlStore) -> None:
    before = (await store.revisions()).models
    await store.add_model("m", DOC)
    await store.update_model("m", DOC)
    await store.delete_model("m")
    assert (await store.revisions()).models == before + 3
