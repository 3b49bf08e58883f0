"""Admission through the real state over SQLite: 401, 403, 429 with Retry-After, open mode."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from control.tenancy.support import FakeClock, Tenancy, bearer, make_tenancy, make_tree

from llmgw_control.api_errors import ClientApiError
from llmgw_control.store import Quota
from llmgw_control.tenancy import OpenAdmission, OpenTicket, UsageAccumulator
from support.waiting import wait_until


def _refused(tenancy: Tenancy, auth: str | None, model: str = "m", tokens: int = 10) -> ClientApiError:
    with pytest.raises(ClientApiError) as info:
        tenancy.admission.admit(auth, model, estimated_tokens=tokens)
    return info.value


async def test_open_without_keys_records_usage_by_model_only(tenancy: Tenancy, clock: FakeClock) -> None:
    ticket = tenancy.admission.admit(None, "m", estimated_tokens=100)
    assert isinstance(ticket, OpenTicket)
    assert (ticket.key_id, ticket.group_id) == (None, None)
    ticket.settle(3, 4)
    ticket.settle(3, 4)  # a second settle is ignored
    [row] = tenancy.usage.pending()
    assert (row.key_id, row.group_id, row.model, row.requests, row.prompt_tokens, row.completion_tokens) == (
        "",
        "",
        "m",
        1,
        3,
        4,
    )


async def test_open_admission_without_a_store(clock: FakeClock) -> None:
    usage = UsageAccumulator()
    ticket = OpenAdmission(usage, clock=clock).admit("Bearer whatever", "m", estimated_tokens=1)
    ticket.give_back()
    ticket.settle(1, 1)  # after release: ignored
    assert usage.pending() == []


async def test_not_loaded_refuses_rather_than_opening(db_path: Path, clock: FakeClock) -> None:
    t = await make_tenancy(db_path, clock, load=False)
    try:
        error = _refused(t, None)
        assert error.status == 503
    finally:
        await t.store.aclose()


async def test_unknown_missing_revoked_expired_keys_get_401(tenancy: Tenancy, clock: FakeClock) -> None:
    tree = await make_tree(tenancy.service)
    good = await tenancy.service.create_key(name="good", group_id=tree.project)
    expiring = await tenancy.service.create_key(
        name="soon", group_id=tree.project, expires_at=datetime.fromtimestamp(clock() + 60, UTC)
    )
    revoked = await tenancy.service.create_key(name="gone", group_id=tree.project)
    await tenancy.service.revoke_key(revoked.key.id)

    ticket = tenancy.admission.admit(bearer(good.secret), "m", estimated_tokens=1)
    assert (ticket.key_id, ticket.group_id) == (good.key.id, tree.project)
    ticket.give_back()

    cases = {
        None: "missing_api_key",
        "Basic abc": "missing_api_key",
        bearer("sk-llmgw-not-a-real-key"): "invalid_api_key",
        bearer("x" * 10_000): "invalid_api_key",
        bearer(revoked.secret): "api_key_revoked",
    }
    for auth, code in cases.items():
        error = _refused(tenancy, auth)
        assert (error.status, error.code) == (401, code), auth
        assert ("www-authenticate", "Bearer") in error.headers
        assert "sk-llmgw-" not in error.message  # never echo a key back

    tenancy.admission.admit(bearer(expiring.secret), "m", estimated_tokens=1).give_back()
    clock.advance(60)
    error = _refused(tenancy, bearer(expiring.secret))
    assert (error.status, error.code) == (401, "api_key_expired")


async def test_model_allow_list_gives_403(tenancy: Tenancy) -> None:
    tree = await make_tree(tenancy.service)
    key = await tenancy.service.create_key(name="narrow", group_id=tree.team, models=["small", "medium"])
    tenancy.admission.admit(bearer(key.secret), "small", estimated_tokens=1).give_back()
    error = _refused(tenancy, bearer(key.secret), model="large")
    assert (error.status, error.code, error.param) == (403, "model_not_allowed", "model")
    assert "narrow" in error.message and "large" in error.message
    # The allow-list is checked before quotas: a refused model reserves nothing.
    assert tenancy.state.budget(tree.team).in_flight == 0


async def test_all_keys_revoked_keeps_the_gateway_closed(tenancy: Tenancy) -> None:
    tree = await make_tree(tenancy.service)
    key = await tenancy.service.create_key(name="k", group_id=tree.org)
    await tenancy.service.revoke_key(key.key.id)
    assert not tenancy.state.open
    assert _refused(tenancy, None).status == 401


async def test_deleting_the_last_key_opens_the_gateway_and_says_so(
    tenancy: Tenancy, caplog: pytest.LogCaptureFixture
) -> None:
    tree = await make_tree(tenancy.service)
    key = await tenancy.service.create_key(name="k", group_id=tree.org)
    assert _refused(tenancy, None).status == 401
    with caplog.at_level(logging.WARNING, logger="llmgw_control.tenancy"):
        await tenancy.service.delete_key(key.key.id)
    assert tenancy.state.open
    assert "open" in caplog.text
    tenancy.admission.admit(None, "m", estimated_tokens=1).give_back()


async def test_429_names_group_and_limit_with_retry_after(tenancy: Tenancy, clock: FakeClock) -> None:
    tree = await make_tree(tenancy.service)
    await tenancy.service.set_quota(tree.team, Quota(requests_per_minute=2))
    key = await tenancy.service.create_key(name="k", group_id=tree.project)
    auth = bearer(key.secret)
    tenancy.admission.admit(auth, "m", estimated_tokens=1).settle(1, 1)
    clock.advance(20)
    tenancy.admission.admit(auth, "m", estimated_tokens=1).settle(1, 1)
    error = _refused(tenancy, auth)
    assert (error.status, error.code) == (429, "rate_limit_exceeded")
    assert "org/team" in error.message and "requests per minute" in error.message and "limit 2" in error.message
    # The first request leaves the window 61 s after its second began: 41 s from now.
    assert dict(error.headers)["retry-after"] == "41"
    assert error.body()["error"]["type"] == "rate_limit_error"
    clock.advance(41)
    tenancy.admission.admit(auth, "m", estimated_tokens=1).give_back()


async def test_refusal_reports_the_longest_wait_across_levels(tenancy: Tenancy, clock: FakeClock) -> None:
    tree = await make_tree(tenancy.service)
    await tenancy.service.set_quota(tree.project, Quota(requests_per_minute=1))
    await tenancy.service.set_quota(tree.org, Quota(tokens_per_day=1000))
    key = await tenancy.service.create_key(name="k", group_id=tree.project)
    tenancy.admission.admit(bearer(key.secret), "m", estimated_tokens=500).settle(400, 500)
    error = _refused(tenancy, bearer(key.secret), tokens=500)
    # Both the project's rpm and the org's day refuse; the day lasts longer and is named.
    assert "org'" in error.message and "tokens per day" in error.message
    assert int(dict(error.headers)["retry-after"]) == 13.5 * 3600


async def test_request_larger_than_the_limit_says_so_without_retry_after(tenancy: Tenancy) -> None:
    tree = await make_tree(tenancy.service)
    await tenancy.service.set_quota(tree.team, Quota(tokens_per_minute=1000))
    key = await tenancy.service.create_key(name="k", group_id=tree.team)
    error = _refused(tenancy, bearer(key.secret), tokens=1001)
    assert (error.status, error.code) == (429, "request_too_large")
    assert "1001" in error.message and "max_tokens" in error.message
    assert not any(name == "retry-after" for name, _ in error.headers)


async def test_concurrency_limit_and_release(tenancy: Tenancy) -> None:
    tree = await make_tree(tenancy.service)
    await tenancy.service.set_quota(tree.org, Quota(concurrent_requests=2))
    a = await tenancy.service.create_key(name="a", group_id=tree.project)
    b = await tenancy.service.create_key(name="b", group_id=tree.other_team)
    first = tenancy.admission.admit(bearer(a.secret), "m", estimated_tokens=1)
    second = tenancy.admission.admit(bearer(b.secret), "m", estimated_tokens=1)
    error = _refused(tenancy, bearer(a.secret))
    assert "concurrent requests" in error.message and dict(error.headers)["retry-after"] == "1"
    first.give_back()
    third = tenancy.admission.admit(bearer(b.secret), "m", estimated_tokens=1)
    second.settle(1, 1)
    third.settle(1, 1)
    assert tenancy.state.budget(tree.org).in_flight == 0


async def test_ticket_is_finished_by_its_first_call(tenancy: Tenancy, clock: FakeClock) -> None:
    tree = await make_tree(tenancy.service)
    await tenancy.service.set_quota(tree.team, Quota(tokens_per_minute=100, requests_per_minute=10))
    key = await tenancy.service.create_key(name="k", group_id=tree.project)
    team = tenancy.state.budget(tree.team)
    with tenancy.admission.admit(bearer(key.secret), "m", estimated_tokens=80) as ticket:
        assert (team.reserved, team.in_flight) == (80, 1)
        ticket.settle(10, 20)
    # The context manager's release after settle changed nothing: settled tokens stay counted.
    assert (team.reserved, team.in_flight, team.minute_tokens.total(clock()), team.requests.total(clock())) == (
        0,
        0,
        30,
        1,
    )
    with tenancy.admission.admit(bearer(key.secret), "m", estimated_tokens=60):
        pass  # failed: released on exit
    assert (team.reserved, team.in_flight, team.requests.total(clock())) == (0, 0, 1)
    [row] = tenancy.usage.pending()
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, 10, 20)


async def test_revocation_reaches_another_daemon_within_a_poll(db_path: Path, clock: FakeClock) -> None:
    a = await make_tenancy(db_path, clock)
    b = await make_tenancy(db_path, clock)
    try:
        tree = await make_tree(a.service)
        key = await a.service.create_key(name="k", group_id=tree.org)
        async with trio.open_nursery() as nursery:
            await nursery.start(b.state.run)  # polls every 0.02 s
            await wait_until(lambda: not b.state.open, timeout=2, interval=0.01)
            b.admission.admit(bearer(key.secret), "m", estimated_tokens=1).give_back()
            await a.service.revoke_key(key.key.id)
            # The daemon that revoked refuses at once...
            with pytest.raises(ClientApiError):
                a.admission.admit(bearer(key.secret), "m", estimated_tokens=1)
            # ...and the other within one poll (well under the one second promised).
            started = trio.current_time()

            def refused() -> bool:
                try:
                    b.admission.admit(bearer(key.secret), "m", estimated_tokens=1).give_back()
                except ClientApiError as error:
                    assert error.code == "api_key_revoked"
                    return True
                return False

            await wait_until(refused, timeout=1, interval=0.005)
            assert trio.current_time() - started < 0.5
            nursery.cancel_scope.cancel()
    finally:
        await a.store.aclose()
        await b.store.aclose()


async def test_quota_changes_apply_without_losing_counts(tenancy: Tenancy) -> None:
    tree = await make_tree(tenancy.service)
    key = await tenancy.service.create_key(name="k", group_id=tree.project)
    auth = bearer(key.secret)
    # No quota yet, but the team's figures are counted anyway...
    for _ in range(3):
        tenancy.admission.admit(auth, "m", estimated_tokens=10).settle(5, 5)
    held = tenancy.admission.admit(auth, "m", estimated_tokens=10)
    # ...so a quota set now sees them at once.
    await tenancy.service.set_quota(tree.team, Quota(requests_per_minute=4))
    assert _refused(tenancy, auth).status == 429
    held.give_back()
    tenancy.admission.admit(auth, "m", estimated_tokens=10).give_back()
    await tenancy.service.delete_quota(tree.team)
    for _ in range(5):
        tenancy.admission.admit(auth, "m", estimated_tokens=10).give_back()


async def test_foreign_key_secret_is_reported(
    db_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    a = await make_tenancy(db_path, clock)
    try:
        tree = await make_tree(a.service)
        key = await a.service.create_key(name="k", group_id=tree.org)
    finally:
        await a.store.aclose()
    with caplog.at_level(logging.ERROR, logger="llmgw_control.tenancy"):
        b = await make_tenancy(db_path, clock, secret=b"another secret, another daemon!!")
    try:
        assert "different key secret" in caplog.text
        assert _refused(b, bearer(key.secret)).code == "invalid_api_key"
    finally:
        await b.store.aclose()


async def test_a_zero_limit_pauses_a_group(tenancy: Tenancy) -> None:
    tree = await make_tree(tenancy.service)
    key = await tenancy.service.create_key(name="k", group_id=tree.project)
    for limit in ("requests_per_minute", "tokens_per_minute", "tokens_per_day", "concurrent_requests"):
        await tenancy.service.set_quota(tree.team, {limit: 0})
        error = _refused(tenancy, bearer(key.secret))
        assert (error.status, error.code) == (429, "insufficient_quota"), limit
        assert "org/team" in error.message and "limit is 0" in error.message
        assert not any(name == "retry-after" for name, _ in error.headers)
    await tenancy.service.delete_quota(tree.team)
    tenancy.admission.admit(bearer(key.secret), "m", estimated_tokens=10).give_back()


async def test_a_dropped_ticket_gives_its_slot_back(tenancy: Tenancy, caplog: pytest.LogCaptureFixture) -> None:
    tree = await make_tree(tenancy.service)
    await tenancy.service.set_quota(tree.team, Quota(concurrent_requests=1))
    key = await tenancy.service.create_key(name="k", group_id=tree.project)
    with caplog.at_level(logging.WARNING, logger="llmgw_control.tenancy"):
        tenancy.admission.admit(bearer(key.secret), "m", estimated_tokens=10)  # a caller bug: never finished
    assert "dropped without settle or give_back" in caplog.text
    assert tenancy.state.budget(tree.team).in_flight == 0
    tenancy.admission.admit(bearer(key.secret), "m", estimated_tokens=10).give_back()
