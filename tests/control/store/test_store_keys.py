"""API keys: digests only, allow-lists, revocation, and the cheap incremental refresh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import trio
import trio.lowlevel

from llmgw_control.store import Conflict, InvalidInput, NotFound, SqlStore


async def _group(store: SqlStore, name: str = "team") -> str:
    return (await store.create_group(name)).id


async def test_create_and_look_up(store: SqlStore) -> None:
    gid = await _group(store)
    expires = datetime(2030, 1, 1, tzinfo=UTC)
    key = await store.create_key(
        name="ci", group_id=gid, digest="hmac-1", models=["a", "b"], admin=True, expires_at=expires
    )
    assert key.models == ("a", "b") and key.admin and key.expires_at == expires and key.revoked_at is None
    assert await store.key_by_digest("hmac-1") == key
    assert await store.key_by_digest("hmac-unknown") is None
    assert await store.get_key(key.id) == key
    open_key = await store.create_key(name="any", group_id=gid, digest="hmac-2", key_id="k2")
    assert open_key.id == "k2" and open_key.models is None and not open_key.admin
    assert [k.id for k in await store.list_keys(gid)] == [key.id, "k2"]
    assert await store.list_keys("other") == []


async def test_refusals(store: SqlStore) -> None:
    gid = await _group(store)
    await store.create_key(name="a", group_id=gid, digest="same", key_id="k1")
    with pytest.raises(Conflict) as info:
        await store.create_key(name="b", group_id=gid, digest="same")
    assert info.value.field == "digest"
    with pytest.raises(Conflict) as info:
        await store.create_key(name="b", group_id=gid, digest="other", key_id="k1")
    assert info.value.field == "key_id"
    with pytest.raises(InvalidInput) as invalid:
        await store.create_key(name="b", group_id="nope", digest="other")
    assert invalid.value.field == "group_id"
    cases: list[tuple[dict[str, object], str]] = [
        ({"models": "a"}, "models"),
        ({"models": ["a", "a"]}, "models"),
        ({"models": ["ok", ""]}, "models[1]"),
        ({"admin": 1}, "admin"),
        ({"expires_at": datetime(2030, 1, 1)}, "expires_at"),
        ({"name": ""}, "name"),
    ]
    for kwargs, field in cases:
        args: dict[str, object] = {"name": "b", "group_id": gid, "digest": "other", **kwargs}
        with pytest.raises(InvalidInput) as invalid:
            await store.create_key(**args)  # type: ignore[arg-type]
        assert invalid.value.field == field
    assert len(await store.list_keys()) == 1


async def test_update_revoke_delete(store: SqlStore) -> None:
    g1 = await _group(store, "g1")
    g2 = await _group(store, "g2")
    key = await store.create_key(name="k", group_id=g1, digest="d", models=["a"])
    updated = await store.update_key(key.id, name="renamed", group_id=g2, models=None, admin=True)
    assert (updated.name, updated.group_id, updated.models, updated.admin) == ("renamed", g2, None, True)
    assert updated.revision > key.revision
    with pytest.raises(InvalidInput):
        await store.update_key(key.id, group_id="nope")
    with pytest.raises(NotFound):
        await store.update_key("nope", name="x")

    now = datetime.now(UTC)
    assert updated.usable_at(now)
    revoked = await store.revoke_key(key.id)
    assert revoked.revoked_at is not None and not revoked.usable_at(revoked.revoked_at + timedelta(seconds=1))
    again = await store.revoke_key(key.id)
    assert again.revoked_at == revoked.revoked_at

    expiring = await store.update_key(key.id, expires_at=now - timedelta(seconds=1))
    assert not expiring.usable_at(now)

    await store.delete_key(key.id)
    with pytest.raises(NotFound):
        await store.get_key(key.id)
    with pytest.raises(NotFound):
        await store.delete_key(key.id)
    assert await store.key_by_digest("d") is None


async def test_incremental_refresh(store: SqlStore) -> None:
    gid = await _group(store)
    first = await store.keys_changed_since(0)
    assert first.reset and first.changed == () and first.revision == await store.key_revision()

    a = await store.create_key(name="a", group_id=gid, digest="da")
    b = await store.create_key(name="b", group_id=gid, digest="db")
    snapshot = await store.keys_changed_since(first.revision)
    assert snapshot.reset  # no key was ever written: the marker is still 0, a full load
    assert [k.id for k in snapshot.changed] == [a.id, b.id]
    marker = snapshot.revision

    # Nothing changed: the same marker comes back and nothing is listed.
    idle = await store.keys_changed_since(marker)
    assert (idle.revision, idle.changed, idle.deleted) == (marker, (), ())

    await store.revoke_key(a.id)
    await store.delete_key(b.id)
    changes = await store.keys_changed_since(marker)
    assert not changes.reset
    assert [k.id for k in changes.changed] == [a.id]
    assert changes.changed[0].revoked_at is not None
    assert changes.deleted == (b.id,)
    assert changes.revision == await store.key_revision() > marker

    # A marker from the future (the database was restored from an older backup): full reload.
    future = await store.keys_changed_since(changes.revision + 100)
    assert future.reset and [k.id for k in future.changed] == [a.id] and future.deleted == ()


async def test_refresh_sees_every_concurrent_write(store: SqlStore) -> None:
    """Writers racing each other: a reader polling with markers misses none of them."""
    gid = await _group(store)
    seen: dict[str, int] = {}
    marker = (await store.keys_changed_since(0)).revision
    done = trio.Event()

    async def writer(n: int) -> None:
        for i in range(5):
            await store.create_key(name=f"w{n}-{i}", group_id=gid, digest=f"w{n}-{i}")

    async def reader() -> None:
        nonlocal marker
        while True:
            # Decide before polling: a poll already in flight when the writers finish may
            # predate their last commit, so one more poll must follow.
            last = done.is_set()
            changes = await store.keys_changed_since(marker)
            for key in changes.changed:
                seen[key.id] = key.revision
            marker = changes.revision
            if last:
                return
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        async with trio.open_nursery() as writers:
            for n in range(4):
                writers.start_soon(writer, n)
        done.set()
    assert len(seen) == 20
    assert {k.id for k in await store.list_keys()} == set(seen)
