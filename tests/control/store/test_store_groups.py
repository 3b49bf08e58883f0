"""The group tree: sibling-unique names, no cycles, no deleting groups still in use."""

from __future__ import annotations

import pytest

from llmgw_control.store import Conflict, InvalidInput, NotFound, Quota, SqlStore


async def test_tree(store: SqlStore) -> None:
    org = await store.create_group("acme")
    team = await store.create_group("research", org.id)
    project = await store.create_group("llm", team.id, group_id="proj-llm")
    assert project.id == "proj-llm" and project.parent_id == team.id
    assert org.parent_id is None
    assert await store.group_subtree(org.id) == sorted([org.id, team.id, project.id])
    assert await store.group_subtree(project.id) == [project.id]
    assert {g.id for g in await store.list_groups()} == {org.id, team.id, project.id}
    assert await store.get_group(team.id) == team
    with pytest.raises(NotFound):
        await store.group_subtree("nope")


async def test_names_unique_among_siblings_only(store: SqlStore) -> None:
    a = await store.create_group("a")
    b = await store.create_group("b")
    await store.create_group("dev", a.id)
    await store.create_group("dev", b.id)  # same name, other parent: fine
    with pytest.raises(Conflict, match="'dev' already exists under") as info:
        await store.create_group("dev", a.id)
    assert info.value.field == "name"
    # Roots are siblings too, even though their parent is NULL.
    with pytest.raises(Conflict, match="already exists at the root"):
        await store.create_group("a")
    with pytest.raises(Conflict):
        await store.update_group(b.id, name="a")
    with pytest.raises(Conflict, match="group 'x' already exists"):
        await store.create_group("x1", group_id="x") and await store.create_group("x2", group_id="x")


async def test_missing_parent_is_invalid_input(store: SqlStore) -> None:
    with pytest.raises(InvalidInput) as info:
        await store.create_group("orphan", "no-such-group")
    assert info.value.field == "parent_id"
    assert await store.list_groups() == []


async def test_move_refuses_cycles(store: SqlStore) -> None:
    a = await store.create_group("a")
    b = await store.create_group("b", a.id)
    c = await store.create_group("c", b.id)
    for target in (a.id, b.id, c.id):
        with pytest.raises(Conflict, match="cycle") as info:
            await store.update_group(a.id, parent_id=target)
        assert info.value.field == "parent_id"
    # Moving a subtree elsewhere and back to the root is fine.
    d = await store.create_group("d")
    moved = await store.update_group(b.id, parent_id=d.id)
    assert moved.parent_id == d.id
    assert await store.group_subtree(d.id) == sorted([d.id, b.id, c.id])
    root = await store.update_group(b.id, parent_id=None, name="b-root")
    assert root.parent_id is None and root.name == "b-root"
    with pytest.raises(NotFound):
        await store.update_group("nope", name="x")


async def test_delete_refuses_groups_in_use(store: SqlStore) -> None:
    parent = await store.create_group("parent")
    child = await store.create_group("child", parent.id)
    with pytest.raises(Conflict, match="child groups"):
        await store.delete_group(parent.id)
    await store.create_key(name="k", group_id=child.id, digest="d1")
    with pytest.raises(Conflict, match="API keys"):
        await store.delete_group(child.id)
    assert len(await store.list_groups()) == 2

    leaf = await store.create_group("leaf", parent.id)
    await store.set_quota(leaf.id, Quota(requests_per_minute=5))
    await store.delete_group(leaf.id)  # its quota goes with it
    assert leaf.id not in await store.list_quotas()
    with pytest.raises(NotFound):
        await store.delete_group(leaf.id)


async def test_a_group_priority_is_stored_changed_and_cleared(store: SqlStore) -> None:
    org = await store.create_group("org", priority="batch")
    team = await store.create_group("team", org.id)
    assert org.priority == "batch" and team.priority is None  # None: inherited from the parent
    assert (await store.get_group(org.id)).priority == "batch"
    renamed = await store.update_group(org.id, name="org2")
    assert renamed.priority == "batch"  # not passed: unchanged
    assert (await store.update_group(team.id, priority="interactive")).priority == "interactive"
    assert (await store.update_group(org.id, priority=None)).priority is None
    for bad in ("urgent", "", 1):
        with pytest.raises(InvalidInput, match="priority"):
            await store.create_group("x", priority=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="priority"):
            await store.update_group(team.id, priority=bad)  # type: ignore[arg-type]
    assert {g.name: g.priority for g in await store.list_groups()} == {"org2": None, "team": "interactive"}
