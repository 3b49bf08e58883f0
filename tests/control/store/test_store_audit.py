"""The audit log in the store (issue 34), on SQLite and real PostgreSQL: a row is written in the
transaction of the change it describes, one per action, never with a secret; read newest first in
pages; pruned by age; leadership changes recorded by the lease itself."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from llmgw_control.store import AuditScope, Conflict, InvalidInput, Quota, SqlStore, audit_scope


def scope(action: str = "POST /api/v1/keys") -> AuditScope:
    return AuditScope(actor="key:k1", peer="127.0.0.1", action=action, resource="keys", resource_id="")


async def test_no_scope_no_row(store: SqlStore) -> None:
    await store.create_group("org")
    assert (await store.list_audit()).entries == []


async def test_one_row_per_action_with_the_changes(store: SqlStore) -> None:
    with audit_scope(scope()):
        group = await store.create_group("org", group_id="g1")
        key = await store.create_key(name="k", group_id=group.id, digest="d" * 64)
    page = await store.list_audit()
    assert len(page.entries) == 1
    row = page.entries[0]
    assert (row.actor, row.peer, row.action, row.outcome) == ("key:k1", "127.0.0.1", "POST /api/v1/keys", "ok")
    # The row names the first thing the action changed, and lists every change.
    assert (row.resource, row.resource_id) == ("group", "g1")
    assert [(c["resource"], c["id"], c["op"]) for c in row.changes] == [
        ("group", "g1", "create"),
        ("key", key.id, "create"),
    ]
    assert "d" * 64 not in json.dumps(row.changes)  # the digest is never recorded


async def test_update_keeps_only_changed_fields(store: SqlStore) -> None:
    await store.create_group("org", group_id="g1")
    await store.set_quota("g1", Quota(tokens_per_minute=10))
    with audit_scope(scope("PUT /api/v1/groups/{group_id}/quota")):
        await store.set_quota("g1", Quota(tokens_per_minute=20, requests_per_minute=None))
    [row] = (await store.list_audit()).entries
    assert row.changes == [
        {
            "resource": "quota",
            "id": "g1",
            "op": "update",
            "before": {"tokens_per_minute": 10},
            "after": {"tokens_per_minute": 20},
        }
    ]


async def test_a_failed_write_leaves_no_row(store: SqlStore) -> None:
    await store.create_group("org", group_id="g1")
    with audit_scope(scope()):
        with pytest.raises(Conflict):
            await store.create_group("org")
    assert (await store.list_audit()).entries == []


async def test_a_closed_scope_records_nothing(store: SqlStore) -> None:
    """A task spawned by a request inherits its scope; once the request ended, its writes are not the operator's."""
    s = scope()
    with audit_scope(s):
        pass
    assert not s.open
    await store.create_group("org")
    assert (await store.list_audit()).entries == []


async def test_pages_filters_and_prune(store: SqlStore) -> None:
    for n in range(5):
        await store.record_audit(
            actor=f"key:{n % 2}", peer="::1", action="POST /x", outcome="refused", resource="admin", resource_id=str(n)
        )
    first = await store.list_audit(limit=2)
    assert len(first.entries) == 2 and first.next_cursor is not None
    second = await store.list_audit(limit=2, cursor=first.next_cursor)
    third = await store.list_audit(limit=2, cursor=second.next_cursor)
    ids = [e.resource_id for p in (first, second, third) for e in p.entries]
    assert sorted(ids) == ["0", "1", "2", "3", "4"] and third.next_cursor is None
    assert {e.resource_id for e in (await store.list_audit(actor="key:1")).entries} == {"1", "3"}
    assert (await store.list_audit(resource="nothing")).entries == []
    assert (await store.list_audit(since=datetime.now(UTC) + timedelta(hours=1))).entries == []
    assert await store.prune_audit(datetime.now(UTC) - timedelta(days=1)) == 0
    assert await store.prune_audit(datetime.now(UTC) + timedelta(seconds=1)) == 5
    assert (await store.list_audit()).entries == []


async def test_leadership_changes_are_recorded(store: SqlStore) -> None:
    assert await store.lease.try_acquire("d1", "ws://a", 5) is not None
    assert await store.lease.try_acquire("d1", "ws://a", 5) is not None  # still ours: no change
    assert await store.lease.give_up("d1")
    rows = (await store.list_audit(resource="leadership")).entries
    assert sorted(r.action for r in rows) == ["leadership.acquire", "leadership.release"]
    assert {r.actor for r in rows} == {"daemon:d1"}


async def test_ending_sessions_is_recorded_with_its_row(store: SqlStore) -> None:
    """Dashboard sessions ended on the server (ops_sessions): the revocation and its audit row commit
    together; a later one only moves the time forward; rows past every session's life go."""
    now = datetime.now(UTC)
    with audit_scope(scope("POST /api/v1/sessions/revoke")):
        cut = await store.revoke_sessions("user:ada@example.org", before=now, until=now + timedelta(hours=8))
    assert cut == now.replace(microsecond=now.microsecond)
    [row] = (await store.list_audit()).entries
    assert (row.resource, row.resource_id, row.changes[0]["op"]) == ("session", "user:ada@example.org", "create")
    # An earlier time does not un-end sessions.
    assert (
        await store.revoke_sessions(
            "user:ada@example.org", before=now - timedelta(hours=1), until=now + timedelta(hours=8)
        )
        == cut
    )
    await store.revoke_sessions("session:abc", before=now, until=now + timedelta(seconds=1))
    assert await store.session_revocations(now) == {"user:ada@example.org": cut, "session:abc": cut}
    assert await store.session_revocations(now + timedelta(hours=1)) == {"user:ada@example.org": cut}
    # The next revocation's transaction deletes rows no session can need.
    await store.revoke_sessions("key:k1", before=now + timedelta(hours=1), until=now + timedelta(hours=9))
    assert set(await store.session_revocations(now)) == {"user:ada@example.org", "key:k1"}
    for bad in ("ada", "user:", "user:a\nb", "user:" + "x" * 300):
        with pytest.raises(InvalidInput):
            await store.revoke_sessions(bad, before=now, until=now)
