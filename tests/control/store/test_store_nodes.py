"""Node identities: join-token digests, labels, cordon flag, last seen."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llmgw_control.store import Conflict, InvalidInput, NotFound, SqlStore


async def test_add_update_touch_delete(store: SqlStore) -> None:
    node = await store.add_node("gpu-1", "digest-a", {"zone": "b", "arch": "x86_64"})
    assert node.labels == {"arch": "x86_64", "zone": "b"}
    assert node.cordoned is False
    assert node.last_seen_at is None
    with pytest.raises(Conflict, match="node 'gpu-1' already exists"):
        await store.add_node("gpu-1", "digest-b")

    cordoned = await store.update_node("gpu-1", cordoned=True)
    assert cordoned.cordoned is True and cordoned.token_digest == "digest-a"
    rotated = await store.update_node("gpu-1", token_digest="digest-c", labels={})
    assert rotated.token_digest == "digest-c" and rotated.labels == {} and rotated.cordoned is True

    seen = datetime(2026, 12, 2, 10, 0, 0, 123456, tzinfo=UTC)
    await store.touch_node("gpu-1", seen)
    assert (await store.get_node("gpu-1")).last_seen_at == seen
    await store.touch_node("gpu-1")
    last = (await store.get_node("gpu-1")).last_seen_at
    assert last is not None and last > seen

    await store.add_node("cpu-1", "digest-d")
    assert [n.id for n in await store.list_nodes()] == ["cpu-1", "gpu-1"]
    await store.delete_node("gpu-1")
    with pytest.raises(NotFound):
        await store.get_node("gpu-1")
    with pytest.raises(NotFound):
        await store.touch_node("gpu-1")
    with pytest.raises(NotFound):
        await store.update_node("gpu-1", cordoned=False)


async def test_bad_input(store: SqlStore) -> None:
    with pytest.raises(InvalidInput) as info:
        await store.add_node("n", "d", {"k": 1})  # type: ignore[dict-item]
    assert info.value.field == "labels"
    with pytest.raises(InvalidInput) as info:
        await store.add_node("n", "")
    assert info.value.field == "token_digest"
    await store.add_node("n", "d")
    with pytest.raises(InvalidInput) as info:
        await store.update_node("n", cordoned="yes")  # type: ignore[arg-type]
    assert info.value.field == "cordoned"
    with pytest.raises(InvalidInput) as info:
        await store.touch_node("n", datetime(2026, 1, 1))  # naive: refused
    assert info.value.field == "seen_at"


async def test_touch_does_not_bump_the_revision(store: SqlStore) -> None:
    await store.add_node("n", "d")
    before = await store.revisions()
    await store.touch_node("n")
    assert await store.revisions() == before
