"""The model mirror's pull documents: put (insert, then replace), list in order, delete."""

from __future__ import annotations

import pytest

from llmgw_control.store import NotFound, SqlStore


async def test_put_replaces_list_orders_delete_removes(store: SqlStore) -> None:
    await store.put_pull("a1", {"id": "a1", "state": "queued"})
    await store.put_pull("b2", {"id": "b2", "state": "queued"})
    await store.put_pull("a1", {"id": "a1", "state": "ready", "draft": {"name": "m"}})
    assert await store.list_pulls() == [
        {"id": "a1", "state": "ready", "draft": {"name": "m"}},
        {"id": "b2", "state": "queued"},
    ]
    await store.delete_pull("a1")
    assert [d["id"] for d in await store.list_pulls()] == ["b2"]
    with pytest.raises(NotFound):
        await store.delete_pull("a1")
