"""The nodes that held replicas under a leader, for the next one: on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from llmgw_control.store import InvalidInput, SqlStore


async def test_holders_are_kept_per_epoch_and_a_deposed_leader_cannot_overwrite(store: SqlStore) -> None:
    assert await store.fleet_holders() is None  # no leader ever wrote one
    assert await store.remember_holders(3, ["n2", "n1", "n1"])
    held = await store.fleet_holders()
    assert held is not None and held.epoch == 3 and held.nodes == frozenset({"n1", "n2"})
    assert await store.remember_holders(3, [])  # the same leader, later: nothing held now
    assert (await store.fleet_holders()).nodes == frozenset()  # type: ignore[union-attr]
    assert await store.remember_holders(4, ["n3"])
    assert not await store.remember_holders(3, ["n1"])  # epoch 3 was deposed by 4
    assert (await store.fleet_holders()).nodes == frozenset({"n3"})  # type: ignore[union-attr]


async def test_holders_refuse_bad_input(store: SqlStore) -> None:
    with pytest.raises(InvalidInput):
        await store.remember_holders(0, ["n1"])
    with pytest.raises(InvalidInput):
        await store.remember_holders(1, ["x" * 1000])
