"""Quotas per group: any limit optional, upsert, validation."""

from __future__ import annotations

import pytest

from llmgw_control.store import InvalidInput, NotFound, Quota, SqlStore


async def test_set_get_replace_delete(store: SqlStore) -> None:
    gid = (await store.create_group("g")).id
    assert await store.get_quota(gid) is None
    full = Quota(requests_per_minute=60, tokens_per_minute=10_000, tokens_per_day=1_000_000, concurrent_requests=4)
    assert await store.set_quota(gid, full) == full
    assert await store.get_quota(gid) == full
    partial = Quota(tokens_per_day=5)
    assert await store.set_quota(gid, partial) == partial
    assert await store.list_quotas() == {gid: partial}
    await store.delete_quota(gid)
    assert await store.get_quota(gid) is None
    with pytest.raises(NotFound):
        await store.delete_quota(gid)


async def test_refusals(store: SqlStore) -> None:
    with pytest.raises(NotFound, match="group 'nope'"):
        await store.set_quota("nope", Quota(requests_per_minute=1))
    with pytest.raises(NotFound):
        await store.get_quota("nope")
    gid = (await store.create_group("g")).id
    for quota, field in [
        (Quota(requests_per_minute=-1), "requests_per_minute"),
        (Quota(tokens_per_minute=1.5), "tokens_per_minute"),  # type: ignore[arg-type]
        (Quota(tokens_per_day=True), "tokens_per_day"),
        (Quota(concurrent_requests="4"), "concurrent_requests"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(InvalidInput) as info:
            await store.set_quota(gid, quota)
        assert info.value.field == field
    assert await store.list_quotas() == {}
    # Zero is a real limit (block the group), not "no limit".
    assert (await store.set_quota(gid, Quota(requests_per_minute=0))).requests_per_minute == 0
