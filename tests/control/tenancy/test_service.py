"""The functions the admin API calls: validation with errors naming the field, and their effects."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from control.tenancy.support import FakeClock, Tenancy, bearer, make_tree

from llmgw_control.api_errors import ClientApiError
from llmgw_control.store import Conflict, InvalidInput, NotFound, Quota
from llmgw_control.tenancy import parse_quota


def test_parse_quota() -> None:
    assert parse_quota({}) == Quota()
    assert parse_quota({"tokens_per_minute": 10, "concurrent_requests": None}) == Quota(tokens_per_minute=10)
    assert parse_quota({"requests_per_minute": 0}) == Quota(requests_per_minute=0)  # 0 pauses a group
    bad = [
        ([], "quota"),
        ({"tokens_per_hour": 1}, "quota.tokens_per_hour"),
        ({"tokens_per_day": -1}, "quota.tokens_per_day"),
        ({"tokens_per_day": 1.5}, "quota.tokens_per_day"),
        ({"tokens_per_day": "10"}, "quota.tokens_per_day"),
        ({"concurrent_requests": True}, "quota.concurrent_requests"),
    ]
    for value, field in bad:
        with pytest.raises(InvalidInput) as info:
            parse_quota(value)
        assert info.value.field == field


async def test_key_creation_shows_the_secret_once_and_stores_a_digest(tenancy: Tenancy) -> None:
    tree = await make_tree(tenancy.service)
    created = await tenancy.service.create_key(name="ci", group_id=tree.team, models=["m"], admin=True)
    assert created.secret.startswith("sk-llmgw-")
    assert created.secret not in repr(created)
    stored = await tenancy.store.get_key(created.key.id)
    assert stored.digest == tenancy.state.digester.digest(created.secret)
    assert created.secret not in stored.digest
    assert (stored.models, stored.admin) == (("m",), True)
    entry = tenancy.state.authenticate(bearer(created.secret))
    assert entry.admin and entry.id == created.key.id
    assert [k.id for k in await tenancy.service.list_keys(tree.team)] == [created.key.id]


async def test_key_input_errors_name_the_field(tenancy: Tenancy, clock: FakeClock) -> None:
    tree = await make_tree(tenancy.service)
    past = datetime.fromtimestamp(clock() - 1, UTC)
    cases = [
        (dict(name="k", group_id=tree.team, expires_at=past), "expires_at"),
        (dict(name="k", group_id=tree.team, expires_at=datetime(2030, 1, 1)), "expires_at"),
        (dict(name="", group_id=tree.team), "name"),
        (dict(name="k", group_id="nope"), "group_id"),
        (dict(name="k", group_id=tree.team, models=["a", "a"]), "models"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidInput) as info:
            await tenancy.service.create_key(**kwargs)  # type: ignore[arg-type]
        assert info.value.field == field, kwargs
    assert await tenancy.service.list_keys() == []
    assert tenancy.state.open  # nothing partial was written
    with pytest.raises(NotFound):
        await tenancy.service.revoke_key("nope")


async def test_update_key_changes_what_admission_checks(tenancy: Tenancy, clock: FakeClock) -> None:
    tree = await make_tree(tenancy.service)
    created = await tenancy.service.create_key(name="k", group_id=tree.team)
    auth = bearer(created.secret)
    tenancy.admission.admit(auth, "big", estimated_tokens=1).give_back()
    await tenancy.service.update_key(created.key.id, models=["small"])
    with pytest.raises(ClientApiError) as info:
        tenancy.admission.admit(auth, "big", estimated_tokens=1)
    assert info.value.status == 403
    await tenancy.service.update_key(created.key.id, expires_at=datetime.fromtimestamp(clock() + 5, UTC))
    tenancy.admission.admit(auth, "small", estimated_tokens=1).give_back()
    clock.advance(5)
    with pytest.raises(ClientApiError) as info:
        tenancy.admission.admit(auth, "small", estimated_tokens=1)
    assert info.value.code == "api_key_expired"


async def test_group_and_quota_errors(tenancy: Tenancy) -> None:
    tree = await make_tree(tenancy.service)
    with pytest.raises(Conflict):
        await tenancy.service.create_group("team", tree.org)  # sibling names are unique
    with pytest.raises(InvalidInput) as info:
        await tenancy.service.create_group("x", "nope")
    assert info.value.field == "parent_id"
    with pytest.raises(Conflict):
        await tenancy.service.update_group(tree.org, parent_id=tree.project)  # a cycle
    with pytest.raises(NotFound):
        await tenancy.service.set_quota("nope", Quota(tokens_per_minute=1))
    with pytest.raises(InvalidInput) as info:
        await tenancy.service.set_quota(tree.team, {"tokens_per_minute": -5})
    assert info.value.field == "quota.tokens_per_minute"
    assert await tenancy.service.set_quota(tree.team, {"tokens_per_minute": 5}) == Quota(tokens_per_minute=5)
    assert await tenancy.service.get_quota(tree.team) == Quota(tokens_per_minute=5)
    assert await tenancy.service.list_quotas() == {tree.team: Quota(tokens_per_minute=5)}
    await tenancy.service.delete_quota(tree.team)
    assert await tenancy.service.get_quota(tree.team) is None


async def test_moving_a_group_changes_which_quotas_apply(tenancy: Tenancy) -> None:
    tree = await make_tree(tenancy.service)
    await tenancy.service.set_quota(tree.other_team, Quota(concurrent_requests=0))
    key = await tenancy.service.create_key(name="k", group_id=tree.project)
    held = tenancy.admission.admit(bearer(key.secret), "m", estimated_tokens=10)
    await tenancy.service.update_group(tree.project, parent_id=tree.other_team)
    assert tenancy.state.tree.path(tree.project) == "org/other-team/project"
    with pytest.raises(ClientApiError) as info:
        tenancy.admission.admit(bearer(key.secret), "m", estimated_tokens=10)
    assert "org/other-team" in info.value.message
    # The request admitted before the move settles against the chain it reserved in.
    held.settle(5, 5)
    team = tenancy.state.budget(tree.team)
    assert (team.in_flight, team.reserved) == (0, 0)
    assert tenancy.state.budget(tree.other_team).in_flight == 0
