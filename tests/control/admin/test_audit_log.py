"""The audit log through the admin API (issue 34): every state-changing route, enumerated from the
app itself, leaves exactly one row naming who, from where and what; refusals are recorded; no
secret (a key's, a join token's) ever appears in a row."""

from __future__ import annotations

import json
import string
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import httpx2
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from system.releases import fake_release

from llmgw_control.mirror.config import HubConfig
from llmgw_dev.fake_hub import FakeHub, FakeRepo, run_fake_hub
from support.waiting import wait_until

from .conftest import Daemon, fake_node, model_doc, running_control

REPO, FILE = "acme/tiny-GGUF", "tiny.Q8_0.gguf"
WHEELS = {f"{dist}-0.1.0-py3-none-any.whl": b"not really a wheel" for dist in ("llmgw_shared", "llmgw_node")}


@attrs.define
class World:
    """What the recipes share: ids made by earlier steps."""

    daemon: Daemon
    ids: dict[str, str] = attrs.Factory(dict)


Recipe = Callable[[World], Awaitable[Any]]


async def rows(daemon: Daemon, **query: str) -> list[dict[str, Any]]:
    answer = await daemon.admin.get("/audit", params={"limit": "500", **query})
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return [e for e in entries if e["resource"] != "leadership"]


async def pull_ready(w: World) -> None:
    async def ready() -> bool:
        return bool((await w.daemon.admin.get(f"/models/pulls/{w.ids['pull']}")).json()["pull"]["state"] == "ready")

    await wait_until(ready, timeout=30)


def ok(answer: Any) -> Any:
    assert answer.status_code < 300, answer.text
    return answer.json() if answer.status_code != 204 else None


# One recipe per write route, in an order where each finds what it needs. A route the app serves
# that has no recipe here fails the test: a new route must show that it is audited.
async def _groups_create(w: World) -> None:
    w.ids["group"] = ok(await w.daemon.admin.post("/groups", json={"name": "org"}))["group"]["id"]


async def _keys_create(w: World) -> None:
    w.ids["key"] = ok(await w.daemon.admin.post("/keys", json={"name": "k", "group_id": w.ids["group"]}))["key"]["id"]


async def _pull_start(w: World) -> None:
    w.ids["pull"] = ok(await w.daemon.admin.post("/models/pulls", json={"repo": REPO, "file": FILE}))["pull"]["id"]


async def _pull_draft(w: World) -> None:
    await pull_ready(w)
    draft = (await w.daemon.admin.get(f"/models/pulls/{w.ids['pull']}")).json()["pull"]["draft"]
    ok(await w.daemon.admin.put(f"/models/pulls/{w.ids['pull']}/draft", json=draft))


async def _capacity_start(w: World) -> None:
    answer = ok(await w.daemon.admin.post("/capacity/runs", json={"model": "tiny", "levels": [1]}))
    w.ids["run"] = answer["run"]["id"]


async def _capacity_start_again(w: World) -> None:
    answer = ok(await w.daemon.admin.post("/capacity/runs", json={"model": "tiny", "levels": [1]}))
    w.ids["run2"] = answer["run"]["id"]


RECIPES: list[tuple[str, Recipe]] = [
    ("POST /api/v1/groups", _groups_create),
    (
        "PATCH /api/v1/groups/{group_id}",
        lambda w: w.daemon.admin.patch(f"/groups/{w.ids['group']}", json={"name": "org2"}),
    ),
    ("POST /api/v1/keys", _keys_create),
    ("POST /api/v1/keys/{key_id}/revoke", lambda w: w.daemon.admin.post(f"/keys/{w.ids['key']}/revoke")),
    ("DELETE /api/v1/keys/{key_id}", lambda w: w.daemon.admin.delete(f"/keys/{w.ids['key']}")),
    (
        "PUT /api/v1/groups/{group_id}/quota",
        lambda w: w.daemon.admin.put(f"/groups/{w.ids['group']}/quota", json={"tokens_per_minute": 10}),
    ),
    ("DELETE /api/v1/groups/{group_id}/quota", lambda w: w.daemon.admin.delete(f"/groups/{w.ids['group']}/quota")),
    ("DELETE /api/v1/groups/{group_id}", lambda w: w.daemon.admin.delete(f"/groups/{w.ids['group']}")),
    ("POST /api/v1/models", lambda w: w.daemon.admin.post("/models", json=model_doc())),
    ("PUT /api/v1/models/{name}", lambda w: w.daemon.admin.put("/models/tiny", json=model_doc(context=512))),
    ("POST /api/v1/nodes", lambda w: w.daemon.admin.post("/nodes", json={"name": "n2"})),
    ("POST /api/v1/nodes/{node_id}/token", lambda w: w.daemon.admin.post("/nodes/n2/token")),
    ("POST /api/v1/nodes/{node_id}/cordon", lambda w: w.daemon.admin.post("/nodes/n1/cordon")),
    ("POST /api/v1/nodes/{node_id}/uncordon", lambda w: w.daemon.admin.post("/nodes/n1/uncordon")),
    ("POST /api/v1/nodes/{node_id}/drain", lambda w: w.daemon.admin.post("/nodes/n1/drain")),
    ("POST /api/v1/capacity/runs", _capacity_start),
    (
        "POST /api/v1/capacity/runs/{run_id}/cancel",
        lambda w: w.daemon.admin.post(f"/capacity/runs/{w.ids['run']}/cancel"),
    ),
    ("DELETE /api/v1/capacity/runs/{run_id}", lambda w: w.daemon.admin.delete(f"/capacity/runs/{w.ids['run2']}")),
    (
        "POST /api/v1/models/{name}/profiles/{profile}/adapters",
        lambda w: w.daemon.admin.post(
            "/models/tiny/profiles/cpu/adapters",
            json={"name": "bot", "url": "/adapters/bot.gguf", "sha256": "b" * 64, "size": 1000},
        ),
    ),
    (
        "PATCH /api/v1/models/{name}/profiles/{profile}/adapters/{adapter}",
        lambda w: w.daemon.admin.patch("/models/tiny/profiles/cpu/adapters/bot", json={"scale": 0.5}),
    ),
    (
        "DELETE /api/v1/models/{name}/profiles/{profile}/adapters/{adapter}",
        lambda w: w.daemon.admin.delete("/models/tiny/profiles/cpu/adapters/bot"),
    ),
    ("DELETE /api/v1/models/{name}", lambda w: w.daemon.admin.delete("/models/tiny")),
    ("POST /api/v1/models/pulls", _pull_start),
    ("PUT /api/v1/models/pulls/{pull_id}/draft", _pull_draft),
    (
        "POST /api/v1/models/pulls/{pull_id}/publish",
        lambda w: w.daemon.admin.post(f"/models/pulls/{w.ids['pull']}/publish"),
    ),
    ("DELETE /api/v1/models/pulls/{pull_id}", lambda w: w.daemon.admin.delete(f"/models/pulls/{w.ids['pull']}")),
    (
        "POST /api/v1/sessions/revoke",
        lambda w: w.daemon.admin.post("/sessions/revoke", json={"user": "ada@example.org"}),
    ),
]


# What a recipe needs done first, by other routes (their rows are not the recipe's).
SETUP: dict[str, Recipe] = {"DELETE /api/v1/capacity/runs/{run_id}": _capacity_start_again}


@pytest.fixture
async def daemon(tmp_path: Path, tiny_gguf: bytes) -> AsyncIterator[Daemon]:
    repos = {REPO: FakeRepo(files={FILE: tiny_gguf})}
    fake_release(tmp_path / "files" / "node-releases", WHEELS)  # so that onboarding can add nodes
    async with (
        run_fake_hub(FakeHub(repos=repos)) as hub,
        running_control(
            tmp_path,
            files_dir=str(tmp_path / "files"),
            control_settings={"hub": HubConfig(endpoint=hub.url, allow_networks=["127.0.0.0/8"])},
        ) as d,
    ):
        yield d


async def test_every_write_route_leaves_exactly_one_row(daemon: Daemon) -> None:
    # The routes the app serves, from its OpenAPI document (generated from the one route table).
    document = (await daemon.admin.get("/openapi.json")).json()
    served = {
        f"{method.upper()} {path}" for path, ops in document["paths"].items() for method in ops if method != "get"
    }
    assert served - {name for name, _ in RECIPES} == set(), "write routes without an audit recipe"
    world = World(daemon)
    async with fake_node(daemon, "n1"):
        for name, recipe in RECIPES:
            if name in SETUP:
                await SETUP[name](world)
            before = len(await rows(daemon))
            answer = await recipe(world)
            if answer is not None and hasattr(answer, "status_code"):
                ok(answer)
            after = await rows(daemon)
            new = after[: len(after) - before]
            # (a pull's own later writes run after its request ended: the daemon's, not rows)
            assert len(new) == 1, (name, new)
            row = new[0]
            assert (row["action"], row["actor"], row["outcome"]) == (name, "loopback", "ok"), row
            assert row["peer"] == "127.0.0.1"
    # What a revocation changed: revoked_at, before and after.
    [revoked] = [r for r in await rows(daemon, resource="key") if r["action"].endswith("/revoke")]
    change = revoked["changes"][0]
    assert change["before"] == {"revoked_at": None} and change["after"]["revoked_at"] is not None


# State-changing rules of the apps that are not admin API routes, each with why it writes no audit row.
NOT_CHANGES = {
    "POST /admin/login": "a sign-in changes nothing stored; a refused one is recorded as a refusal",
    "POST /admin/logout": "ends the caller's own session (voided in the store), not a change to the fleet",
}


def _unsafe_rules(app: Any) -> list[tuple[str, Any]]:
    return [
        (method, rule)
        for rule in app.url_map.iter_rules()
        for method in sorted(rule.methods or ())
        if method in ("POST", "PUT", "PATCH", "DELETE")
    ]


async def test_every_state_changing_rule_of_the_apps_is_an_audited_route(tmp_path: Path) -> None:
    """Below the OpenAPI document: the Quart route tables themselves (the admin listener's app and the
    client port's dashboard pages). Every state-changing rule must be an admin API route (whose view
    opens the audit scope, and which ``RECIPES`` shows leaves its row), or be in ``NOT_CHANGES``."""
    from prometheus_client import CollectorRegistry

    from llmgw_control.admin.app import make_admin_app
    from llmgw_control.admin.audit_log import AuditLog
    from llmgw_control.admin.dashboard import client_dashboard, open_dashboard, register_admin_dashboard

    recipes = {name for name, _ in RECIPES}
    async with running_control(tmp_path) as daemon:
        audit = AuditLog(daemon.tenancy.store)
        admin = make_admin_app(CollectorRegistry(), daemon.fleet, tenancy=daemon.tenancy, audit=audit)
        dash = await open_dashboard(
            fleet=daemon.fleet, tenancy=daemon.tenancy, prometheus="", data_dir=tmp_path, audit=audit
        )
        register_admin_dashboard(admin, dash)
        pages = client_dashboard(dash, admin).pages
        api = admin.extensions["llmgw.api"]
        unaudited = []
        for method, rule in _unsafe_rules(admin):
            route = api.routes[int(rule.endpoint[4:])] if rule.endpoint.startswith("api_") else None
            if route is None or f"{route.method} {route.path}" not in recipes:
                unaudited.append(f"{method} {rule.rule}")
        for method, rule in _unsafe_rules(pages):
            if f"{method} {rule.rule}" not in NOT_CHANGES:
                unaudited.append(f"{method} {rule.rule} (client port)")
        assert unaudited == []
        assert len(_unsafe_rules(admin)) == len(recipes)


async def test_refusals_are_recorded_and_rate_limited(tmp_path: Path) -> None:
    async with running_control(tmp_path) as daemon:
        # A state-changing request from another site to the key-less loopback listener.
        refused = await daemon.admin.post("/groups", json={"name": "x"}, headers={"origin": "http://evil.example"})
        assert refused.status_code == 403
        [row] = await rows(daemon, outcome="refused")
        assert row["actor"] == "anonymous" and row["changes"][0]["after"]["reason"] == "cross_origin"


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.text(min_size=1, max_size=60).filter(lambda s: s.strip() and "\x00" not in s),
    models=st.lists(st.text(alphabet="abcdefghijklmnop-_:", min_size=1, max_size=20), max_size=3),
    typed=st.text(alphabet=string.ascii_letters + string.digits + "-_.~!@#$%^&*", min_size=12, max_size=64),
)
def test_no_secret_in_any_row(
    tmp_path_factory: pytest.TempPathFactory, name: str, models: list[str], typed: str
) -> None:
    """Keys with any names and model lists, join tokens for nodes (made and replaced), a password typed
    into the dashboard's login: none of these secrets ever reaches the log."""

    async def scenario() -> None:
        data = tmp_path_factory.mktemp("d")
        fake_release(data / "node-releases", WHEELS)
        async with running_control(data) as daemon:
            group = ok(await daemon.admin.post("/groups", json={"name": "g"}))["group"]["id"]
            created = await daemon.admin.post("/keys", json={"name": name, "group_id": group, "models": models})
            secrets = [typed]
            if created.status_code == 201:
                secrets.append(created.json()["secret"])
            node = ok(await daemon.admin.post("/nodes", json={"name": "nx"}))
            replaced = ok(await daemon.admin.post(f"/nodes/{node['node_id']}/token"))
            secrets += [
                v for answer in (node, replaced) for k, v in answer.items() if "token" in k and isinstance(v, str)
            ]
            assert len(secrets) >= 3
            async with httpx2.AsyncClient(base_url=daemon.listening.api_url) as browser:
                login = await browser.post("/admin/login", data={"key": typed})
                assert login.status_code == 401
            logged = await rows(daemon)
            assert any(r["outcome"] == "refused" and r["action"] == "POST /admin/login" for r in logged)
            text = json.dumps(logged, ensure_ascii=False)
            for secret in secrets:
                assert secret not in text
                assert secret[-12:] not in text

    trio.run(scenario)


async def test_ctl_lists_and_exports_json_lines(tmp_path: Path) -> None:
    from .test_ctl import ok as ctl_ok

    async with running_control(tmp_path) as daemon:
        for n in range(3):
            ok(await daemon.admin.post("/groups", json={"name": f"g{n}"}))
        listed = (await ctl_ok(daemon, "audit", "--resource", "group", "--limit", "2")).out
        assert listed.splitlines()[0].split()[:3] == ["AT", "ACTOR", "FROM"] and "--cursor" in listed
        exported = (await ctl_ok(daemon, "audit", "export", "--resource", "group")).out.splitlines()
        assert [json.loads(line)["action"] for line in exported] == ["POST /api/v1/groups"] * 3


async def test_ctl_ends_a_users_dashboard_sessions(tmp_path: Path) -> None:
    from .test_ctl import ok as ctl_ok
    from .test_ctl import run as ctl_run

    async with running_control(tmp_path) as daemon:
        said = (await ctl_ok(daemon, "sessions", "revoke", "ada@example.org")).out
        assert said.startswith("dashboard sessions of user:ada@example.org issued before ")
        answer = (await ctl_ok(daemon, "--json", "sessions", "revoke", "--key", "k1")).json()
        assert answer["subject"] == "key:k1"
        assert (await ctl_run(daemon, "sessions", "revoke")).code != 0
        assert (await ctl_run(daemon, "sessions", "revoke", "a\x1bb")).code != 0
        [row, _] = await rows(daemon, resource="session")
        assert (row["resource_id"], row["actor"]) == ("key:k1", "loopback")
