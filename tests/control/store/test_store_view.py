"""The leader's replica view, which standbys serve from: on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from llmgw_control.store import InvalidInput, PublishedReplica, SqlStore

A = PublishedReplica(id="s-a", profile_key="llama:small", url="http://10.0.0.1:8001", slots=4, served_name="llama")
B = PublishedReplica(id="s-b", profile_key="qwen:gpu", url="http://10.0.0.2:8002", slots=1)


async def test_the_view_round_trips_and_each_write_gets_a_new_revision(store: SqlStore) -> None:
    assert await store.replica_view() is None  # no leader ever published
    first = await store.publish_view(1, [B, A])
    view = await store.replica_view()
    assert view is not None and view.epoch == 1 and view.revision == first
    assert view.replicas == (A, B)
    second = await store.publish_view(1, [A])
    assert first is not None and second is not None and second > first
    assert (await store.replica_view()).replicas == (A,)  # type: ignore[union-attr]


async def test_a_write_older_than_the_lease_or_the_view_is_refused(store: SqlStore) -> None:
    grant = None
    for holder in ("one", "two"):  # two terms: the lease's epoch is now the second one's
        grant = await store.lease.try_acquire(holder, "ws://x/agent/v1", 30)
        if holder == "one":
            await store.lease.give_up("one")
    assert grant is not None
    assert await store.publish_view(grant.epoch - 1, [A]) is None  # the deposed leader
    assert await store.replica_view() is None
    assert await store.publish_view(grant.epoch, [B]) is not None
    assert (await store.replica_view()).replicas == (B,)  # type: ignore[union-attr]


async def test_the_view_refuses_bad_input(store: SqlStore) -> None:
    with pytest.raises(InvalidInput):
        await store.publish_view(0, [A])
    with pytest.raises(InvalidInput):
        await store.publish_view(1, [PublishedReplica(id="s", profile_key="k", url="u", slots=0)])
