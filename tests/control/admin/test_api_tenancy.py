"""Groups, keys, quotas, usage and capacity through the admin API: good input, bad input, nothing
partial written, one error shape naming the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx2
import pytest

from llmgw_control.store import StoreUnavailable, Usage

from .conftest import Daemon


def error(response: httpx2.Response, status: int, field: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    assert set(body) == {"message", "code", "field"} and body["message"]
    assert body["field"] == field, body
    return body


async def make_group(d: Daemon, name: str, parent: str | None = None) -> str:
    response = await d.admin.post("/groups", json={"name": name, "parent_id": parent})
    assert response.status_code == 201, response.text
    group_id: str = response.json()["group"]["id"]
    return group_id


async def test_groups_create_list_rename_move_delete(daemon: Daemon) -> None:
    org = await make_group(daemon, "org")
    team = await make_group(daemon, "team", org)
    listed = (await daemon.admin.get("/groups")).json()["groups"]
    assert {g["path"] for g in listed} == {"org", "org/team"}
    got = (await daemon.admin.get(f"/groups/{team}")).json()["group"]
    assert got["parent_id"] == org and got["name"] == "team"

    renamed = await daemon.admin.patch(f"/groups/{team}", json={"name": "squad"})
    assert renamed.json()["group"]["path"] == "org/squad"
    # parent_id absent: not moved; null: made a root.
    assert (await daemon.admin.patch(f"/groups/{team}", json={})).json()["group"]["parent_id"] == org
    moved = await daemon.admin.patch(f"/groups/{team}", json={"parent_id": None})
    assert moved.json()["group"]["parent_id"] is None and moved.json()["group"]["path"] == "squad"

    error(await daemon.admin.delete("/groups/nope"), 404)
    assert (await daemon.admin.delete(f"/groups/{team}")).status_code == 204
    error(await daemon.admin.get(f"/groups/{team}"), 404)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": 3}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"name": "a\x00b"}, "name"),
        ({"name": "ok", "parent": "x"}, "parent"),
        ({"name": "ok", "parent_id": 7}, "parent_id"),
    ],
)
async def test_bad_group_bodies_name_the_field_and_write_nothing(daemon: Daemon, body: Any, field: str) -> None:
    error(await daemon.admin.post("/groups", json=body), 400, field)
    assert (await daemon.admin.get("/groups")).json()["groups"] == []


async def test_group_conflicts_and_missing_parents(daemon: Daemon) -> None:
    org = await make_group(daemon, "org")
    team = await make_group(daemon, "team", org)
    error(await daemon.admin.post("/groups", json={"name": "org"}), 409, "name")
    # A reference in a body to something missing is bad input, named; a missing path object is 404.
    error(await daemon.admin.post("/groups", json={"name": "x", "parent_id": "missing"}), 400, "parent_id")
    assert (
        "cycle"
        in error(await daemon.admin.patch(f"/groups/{org}", json={"parent_id": team}), 409, "parent_id")["message"]
    )
    error(await daemon.admin.delete(f"/groups/{org}"), 409)  # still has a child
    error(await daemon.admin.patch(f"/groups/{org}", json={"name": None}), 400, "name")
    assert len((await daemon.admin.get("/groups")).json()["groups"]) == 2


async def test_body_that_is_not_json_or_not_an_object(daemon: Daemon) -> None:
    body = error(
        await daemon.admin.post("/groups", content=b"{nope", headers={"content-type": "application/json"}), 400
    )
    assert body["code"] == "invalid_json"
    error(await daemon.admin.post("/groups", json=["name"]), 400)
    error(await daemon.admin.post("/groups", json={"name": "a", "parent_id": None, "extra": 1}), 400, "extra")


async def test_keys_secret_shown_once_revoked_and_deleted(daemon: Daemon) -> None:
    org = await make_group(daemon, "org")
    created = await daemon.admin.post(
        "/keys",
        json={
            "name": "ci",
            "group_id": org,
            "models": ["tiny"],
            "admin": True,
            "expires_at": "2099-01-01T00:00:00+01:00",
        },
    )
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    key = created.json()["key"]
    assert secret.startswith("sk-llmgw-") and key["state"] == "active" and key["models"] == ["tiny"]
    assert key["expires_at"] == "2098-12-31T23:00:00Z"
    # Never again: not in the list, not in the key, not even as a digest.
    for response in (await daemon.admin.get("/keys"), await daemon.admin.get(f"/keys/{key['id']}")):
        assert secret not in response.text and "digest" not in response.text
    # The key works on the client port until revoked.
    assert daemon.tenancy.state.authenticate(f"Bearer {secret}").id == key["id"]

    revoked = await daemon.admin.post(f"/keys/{key['id']}/revoke")
    assert revoked.json()["key"]["state"] == "revoked"
    with pytest.raises(Exception, match="revoked"):
        daemon.tenancy.state.authenticate(f"Bearer {secret}")
    assert [k["id"] for k in (await daemon.admin.get("/keys", params={"group_id": org})).json()["keys"]] == [key["id"]]
    assert (await daemon.admin.delete(f"/keys/{key['id']}")).status_code == 204
    error(await daemon.admin.get(f"/keys/{key['id']}"), 404)
    error(await daemon.admin.post(f"/keys/{key['id']}/revoke"), 404)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "k"}, "group_id"),
        ({"name": "k", "group_id": "G", "models": "tiny"}, "models"),
        ({"name": "k", "group_id": "G", "models": ["tiny", 3]}, "models[1]"),
        ({"name": "k", "group_id": "G", "models": ["tiny", "tiny"]}, "models"),
        ({"name": "k", "group_id": "G", "admin": "yes"}, "admin"),
        ({"name": "k", "group_id": "G", "expires_at": "tomorrow"}, "expires_at"),
        ({"name": "k", "group_id": "G", "expires_at": "2099-01-01T00:00:00"}, "expires_at"),
        ({"name": "k", "group_id": "G", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "k", "group_id": "G", "secret": "sk-llmgw-mine"}, "secret"),
    ],
)
async def test_bad_key_bodies_write_nothing(daemon: Daemon, body: dict[str, Any], field: str) -> None:
    group = await make_group(daemon, "org")
    if body.get("group_id") == "G":
        body = {**body, "group_id": group}
    error(await daemon.admin.post("/keys", json=body), 400, field)
    assert (await daemon.admin.get("/keys")).json()["keys"] == []


async def test_a_key_for_a_missing_group(daemon: Daemon) -> None:
    error(await daemon.admin.post("/keys", json={"name": "k", "group_id": "missing"}), 400, "group_id")
    error(await daemon.admin.get("/keys", params={"group_id": "missing"}), 404)
    error(await daemon.admin.get("/keys", params={"group": "x"}), 400, "group")


async def test_quotas_set_replace_clear(daemon: Daemon) -> None:
    org = await make_group(daemon, "org")
    team = await make_group(daemon, "team", org)
    error(await daemon.admin.get(f"/groups/{team}/quota"), 404)
    put = await daemon.admin.put(f"/groups/{team}/quota", json={"tokens_per_minute": 1000, "concurrent_requests": 2})
    assert put.json()["quota"] == {
        "group_id": team,
        "path": "org/team",
        "requests_per_minute": None,
        "tokens_per_minute": 1000,
        "tokens_per_day": None,
        "concurrent_requests": 2,
    }
    # PUT replaces: limits not given are gone.
    await daemon.admin.put(f"/groups/{team}/quota", json={"requests_per_minute": 0})
    listed = (await daemon.admin.get("/quotas")).json()["quotas"]
    assert [(q["group_id"], q["requests_per_minute"], q["tokens_per_minute"]) for q in listed] == [(team, 0, None)]
    # The limit is live at once on the data path.
    assert daemon.tenancy.state.quotas[team].requests_per_minute == 0
    assert (await daemon.admin.delete(f"/groups/{team}/quota")).status_code == 204
    error(await daemon.admin.delete(f"/groups/{team}/quota"), 404)
    assert (await daemon.admin.get("/quotas")).json()["quotas"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tokens_per_minute": -1}, "tokens_per_minute"),
        ({"tokens_per_minute": 1.5}, "tokens_per_minute"),
        ({"tokens_per_minute": "10"}, "tokens_per_minute"),
        ({"tokens_per_minute": True}, "tokens_per_minute"),
        ({"tokens_per_minute": 2**80}, "tokens_per_minute"),
        ({"tokens_per_hour": 5}, "tokens_per_hour"),
    ],
)
async def test_bad_quotas_write_nothing(daemon: Daemon, body: dict[str, Any], field: str) -> None:
    org = await make_group(daemon, "org")
    await daemon.admin.put(f"/groups/{org}/quota", json={"tokens_per_minute": 7})
    error(await daemon.admin.put(f"/groups/{org}/quota", json=body), 400, field)
    assert (await daemon.admin.get(f"/groups/{org}/quota")).json()["quota"]["tokens_per_minute"] == 7
    error(await daemon.admin.put("/groups/missing/quota", json={}), 404)


async def test_usage_filters_and_totals(daemon: Daemon) -> None:
    org = await make_group(daemon, "org")
    team = await make_group(daemon, "team", org)
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    await daemon.tenancy.store.add_usage(
        [
            Usage(hour, "k1", org, "tiny", requests=1, prompt_tokens=10, completion_tokens=5),
            Usage(hour, "k2", team, "tiny", requests=2, prompt_tokens=20, completion_tokens=10),
            Usage(hour - timedelta(hours=3), "k2", team, "big", requests=4, prompt_tokens=40, completion_tokens=20),
        ]
    )

    async def totals(**params: str) -> dict[str, int]:
        response = await daemon.admin.get("/usage", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        assert sum(u["requests"] for u in body["usage"]) == body["totals"]["requests"]
        result: dict[str, int] = body["totals"]
        return result

    assert (await totals())["requests"] == 7
    assert (await totals(group_id=org))["requests"] == 1
    assert (await totals(group_id=org, include_descendants="true"))["requests"] == 7
    assert (await totals(key_id="k2", model="big")) == {"requests": 4, "prompt_tokens": 40, "completion_tokens": 20}
    assert (await totals(since=hour.isoformat()))["requests"] == 3
    assert (await totals(until=hour.isoformat().replace("+00:00", "Z")))["requests"] == 4
    error(await daemon.admin.get("/usage", params={"include_descendants": "yes"}), 400, "include_descendants")
    error(await daemon.admin.get("/usage", params={"since": "2026-01-01"}), 400, "since")
    error(await daemon.admin.get("/usage", params={"since": hour.isoformat(), "until": hour.isoformat()}), 400, "until")
    error(await daemon.admin.get("/usage", params={"group_id": "missing"}), 404)
    error(await daemon.admin.get("/usage", params={"limit": "5"}), 400, "limit")


async def test_capacity_records_and_filters(daemon: Daemon) -> None:
    measured = datetime(2026, 12, 1, tzinfo=UTC)
    for node in ("n1", "n2"):
        await daemon.tenancy.store.add_capacity(
            model="tiny",
            profile="cpu",
            node_id=node,
            engine="llama.cpp b11312",
            concurrency=4,
            tokens_per_s=50.0,
            ttft_p50_s=0.1,
            ttft_p99_s=0.4,
            measured_at=measured,
            detail={"prompt": 128},
        )
    everything = (await daemon.admin.get("/capacity")).json()["capacity"]
    assert len(everything) == 2 and everything[0]["detail"] == {"prompt": 128}
    assert everything[0]["measured_at"] == "2026-12-01T00:00:00Z"
    only = (await daemon.admin.get("/capacity", params={"node_id": "n2"})).json()["capacity"]
    assert [r["node_id"] for r in only] == ["n2"]


async def test_unknown_paths_and_methods_answer_in_the_one_shape(daemon: Daemon) -> None:
    assert (await daemon.admin.get("/nothing-here")).json()["error"]["code"] == "not_found"
    assert (await daemon.admin.delete("/quotas")).json()["error"]["code"] == "method_not_allowed"


async def test_a_store_outage_is_503_and_a_bug_is_a_500_without_a_traceback(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def unavailable(*_: Any, **__: Any) -> Any:
        raise StoreUnavailable("connection refused")

    async def bug(*_: Any, **__: Any) -> Any:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(daemon.tenancy.store, "list_groups", unavailable)
    assert error(await daemon.admin.get("/groups"), 503)["code"] == "store_unavailable"
    monkeypatch.setattr(daemon.tenancy.store, "list_quotas", bug)
    response = await daemon.admin.get("/quotas")
    assert error(response, 500)["code"] == "internal_error"
    assert "secret internals" not in response.text and "Traceback" not in response.text


async def test_a_body_over_the_limit_is_413_in_the_one_shape(daemon: Daemon) -> None:
    response = await daemon.admin.post(
        "/groups",
        content=b'{"name": "' + b"x" * (2 * 1024 * 1024) + b'"}',
        headers={"content-type": "application/json"},
    )
    assert error(response, 413)["code"] == "body_too_large"
