"""Nodes (cordon, drain, uncordon), models added/changed/removed at run time, replicas, engines:
through the admin API, against a daemon with scripted nodes that say yes to everything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest

from llmgw_control.fleet.agents import token_digest as join_digest
from llmgw_control.store import Role
from llmgw_shared.wire import StartReplica, converter

from .conftest import PROVENANCE, Daemon, FakeNode, fake_node, model_doc, running_control, wait_until
from .test_api_tenancy import error

AVX2 = "the CPU has no AVX2: llama.cpp will run several times slower"


async def models(d: Daemon) -> dict[str, dict[str, Any]]:
    return {m["key"]: m for m in (await d.admin.get("/models")).json()["models"]}


async def ready_replicas(d: Daemon, key: str, count: int = 1) -> list[dict[str, Any]]:
    async def check() -> bool:
        return (await models(d)).get(key, {}).get("ready") == count

    await wait_until(check)
    replicas: list[dict[str, Any]] = (await models(d))[key]["replicas"]
    return replicas


async def _true(value: bool) -> bool:
    return value


def starts(node: FakeNode) -> list[StartReplica]:
    return [c for c in node.commands if isinstance(c, StartReplica)]


async def test_nodes_list_their_facts_engine_states_and_warnings(daemon: Daemon) -> None:
    async with fake_node(daemon, "n1", warnings=[AVX2]):
        nodes = (await daemon.admin.get("/nodes")).json()["nodes"]
        assert len(nodes) == 1
        node = nodes[0]
        assert node["id"] == "n1" and node["state"] == "ready" and node["cordoned"] is False
        assert node["warnings"] == [AVX2]
        # Where the node's install came from, as its manifest records it (issue 21).
        # The admin API shows every field; the wire leaves the later ones out at their defaults.
        provenance = {**converter.unstructure(PROVENANCE), "backend": "", "runtime": ""}
        assert node["engines"] == [
            {"name": "llama.cpp", "version": "b11312", "state": "installed b11312", "provenance": provenance}
        ]
        assert node["facts"]["cpu"] == "Test CPU" and node["facts"]["ram_total_mib"] == 8192
        assert (await daemon.admin.get("/nodes/n1")).json()["node"] == node
        engines = (await daemon.admin.get("/engines")).json()["engines"]
        assert engines == [
            {
                "name": "llama.cpp",
                "version": "b11312",
                "release_api": "",
                "nodes": [{"node": "n1", "state": "installed b11312", "provenance": provenance}],
            }
        ]
    error(await daemon.admin.get("/nodes/n9"), 404)
    for verb in ("cordon", "uncordon", "drain"):
        error(await daemon.admin.post(f"/nodes/n9/{verb}"), 404)


async def test_cordon_stops_placement_and_uncordon_resumes_it(daemon: Daemon) -> None:
    async with fake_node(daemon, "n1") as node:
        answer = await daemon.admin.post("/nodes/n1/cordon")
        assert answer.status_code == 200 and answer.json()["node"]["cordoned"] is True
        assert (await daemon.admin.post("/models", json=model_doc(min_replicas=1))).status_code == 201

        async def blocked() -> bool:
            return "schedulable" in (await models(daemon))["tiny:cpu"]["status"]

        await wait_until(blocked)
        assert starts(node) == []

        assert (await daemon.admin.post("/nodes/n1/uncordon")).json()["node"]["cordoned"] is False
        await ready_replicas(daemon, "tiny:cpu")
        assert len(starts(node)) == 1


async def test_drain_withdraws_then_drains_and_replaces_elsewhere(daemon: Daemon) -> None:
    assert (await daemon.admin.post("/models", json=model_doc(min_replicas=1))).status_code == 201
    async with fake_node(daemon, "n1") as n1:
        (replica,) = await ready_replicas(daemon, "tiny:cpu")
        assert replica["node"] == "n1"
        routed = (await daemon.admin.get("/replicas")).json()["replicas"]
        assert [(r["id"], r["routable"]) for r in routed] == [(replica["id"], True)]
        async with fake_node(daemon, "n2") as n2:
            drained = await daemon.admin.post("/nodes/n1/drain")
            assert drained.status_code == 200, drained.text
            assert drained.json()["drained"] == [replica["id"]] and drained.json()["node"]["cordoned"] is True
            # Out of the router in the same call, before the node was even told.
            assert daemon.fleet.reconciler.replicas.get(replica["id"]) is None
            (moved,) = await ready_replicas(daemon, "tiny:cpu")
            assert moved["node"] == "n2"
            await wait_until(lambda: _true(n1.drained(replica["id"])))
            assert len(starts(n2)) == 1
            # A drained node stays cordoned until told otherwise.
            assert (await daemon.admin.get("/nodes/n1")).json()["node"]["cordoned"] is True


def standby_error(response: httpx2.Response, status: int) -> dict[str, Any]:
    """The admin error shape with the leader's address (null: none known) beside the usual fields."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    assert set(body) == {"message", "code", "field", "leader"} and body["message"] and body["field"] is None
    return body


async def test_drain_is_refused_on_a_standby(daemon: Daemon) -> None:
    async with fake_node(daemon, "n1"):
        daemon.fleet.agents.role = Role(leader=False, leader_address="ws://10.0.0.2:8090/agent/v1")
        answer = await daemon.admin.post("/nodes/n1/drain")
        body = standby_error(answer, 409)
        assert body["code"] == "standby" and "10.0.0.2" in body["message"]
        assert body["leader"] == "ws://10.0.0.2:8090/agent/v1"
        assert answer.headers["x-llmgw-leader"] == "ws://10.0.0.2:8090/agent/v1"
        assert daemon.fleet.reconciler.is_cordoned("n1") is False


async def test_a_standby_that_knows_no_leader_answers_503_with_retry_after(daemon: Daemon) -> None:
    async with fake_node(daemon, "n1"):
        daemon.fleet.agents.role = Role(leader=False)
        for path in ("/nodes/n1/cordon", "/nodes/n1/drain"):
            answer = await daemon.admin.post(path)
            body = standby_error(answer, 503)
            assert body["code"] == "standby" and body["leader"] is None
            assert answer.headers["retry-after"] == "1" and answer.headers["x-llmgw-leader"] == "unknown"
        assert daemon.fleet.reconciler.is_cordoned("n1") is False
        # Reads answer from the store, marked: never this daemon's own (stale) fleet state.
        listed = (await daemon.admin.get("/nodes")).json()
        assert (listed["role"], listed["leader"]) == ("standby", None)


async def test_a_cordon_is_stored_with_the_node_identity_and_survives_a_restart(tmp_path: Path) -> None:
    async with running_control(tmp_path) as d:
        await d.tenancy.store.add_node("n1", join_digest("secret-token"))
        # Listed before it ever connected, as a registered identity.
        (listed,) = (await d.admin.get("/nodes")).json()["nodes"]
        assert listed["id"] == "n1" and listed["state"] == "registered" and listed["cordoned"] is False
        assert (await d.admin.post("/nodes/n1/cordon")).json()["node"]["cordoned"] is True
        assert (await d.tenancy.store.get_node("n1")).cordoned is True
    async with running_control(tmp_path) as d:
        assert d.fleet.reconciler.is_cordoned("n1")
        async with fake_node(d, "n1", token="secret-token"):
            assert (await d.admin.get("/nodes/n1")).json()["node"]["cordoned"] is True
            assert (await d.admin.post("/nodes/n1/uncordon")).json()["node"]["cordoned"] is False
        assert (await d.tenancy.store.get_node("n1")).cordoned is False


@pytest.mark.slow  # left out of the quick tier: a model's whole life through the reconciler
async def test_a_model_added_is_served_changed_and_removed_without_a_restart(daemon: Daemon) -> None:
    async with httpx2.AsyncClient(base_url=daemon.listening.api_url) as client, fake_node(daemon, "n1") as node:
        error(await daemon.admin.get("/models/tiny"), 404)
        added = await daemon.admin.post("/models", json=model_doc(min_replicas=1))
        assert added.status_code == 201 and added.json()["source"] == "api"
        assert added.json()["model"]["profiles"][0]["context"] == 256
        assert (await daemon.admin.get("/models/tiny")).json() == added.json()
        # The router knows it at once (the client API lists it), the reconciler places it.
        served = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        assert "tiny" in served and "tiny:cpu" in served
        (first,) = await ready_replicas(daemon, "tiny:cpu")
        assert (await models(daemon))["tiny:cpu"]["claim"] == {"ram_mib": 100, "vram_mib": 0}

        # A change that leaves the engine's command line alone keeps the replica.
        scaled = model_doc(min_replicas=1, max_replicas=3, idle_timeout=60.0)
        assert (await daemon.admin.put("/models/tiny", json=scaled)).status_code == 200
        # "Kept" is an absence: wait for two whole reconcile passes after the change (the first may
        # have been under way when it landed), not for a fixed time that a busy machine outruns.
        seen = daemon.fleet.reconciler.passes
        await wait_until(lambda: _true(daemon.fleet.reconciler.passes >= seen + 2))
        assert [r["id"] for r in (await models(daemon))["tiny:cpu"]["replicas"]] == [first["id"]]

        # A change to the command line replaces it: drained, and started again from the new definition.
        assert (await daemon.admin.put("/models/tiny", json=model_doc(min_replicas=1, context=512))).status_code == 200
        await wait_until(lambda: _true(node.drained(first["id"])))
        (second,) = await ready_replicas(daemon, "tiny:cpu")
        assert second["id"] != first["id"]
        assert "1024" in starts(node)[-1].replica.args  # -c = context x parallel

        assert (await daemon.admin.delete("/models/tiny")).status_code == 204
        await wait_until(lambda: _true(node.drained(second["id"])))
        assert "tiny:cpu" not in await models(daemon)
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        gone = await client.post("/v1/chat/completions", json=chat)
        assert gone.status_code == 404
        assert await daemon.tenancy.store.list_models() == []
        error(await daemon.admin.delete("/models/tiny"), 404)


def _profile(**changes: Any) -> dict[str, Any]:
    return model_doc(**changes)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"profiles": []}, "name"),
        ({"name": "tiny", "profiles": []}, "profiles"),
        ({"name": "bad:name", "profiles": _profile()["profiles"]}, "name"),
        ({**_profile(), "colour": "red"}, "colour"),
        (_profile(context="big"), "profiles[0].context"),
        (_profile(context=8), "profiles[0].context"),
        (_profile(parallel=0), "profiles[0].parallel"),
        (_profile(min_replicas=3, max_replicas=2), "profiles[0].min_replicas"),
        (_profile(engine="vllm"), "profiles[0].engine"),
        (_profile(engine_version="b1"), "profiles[0].engine_version"),
        (_profile(args="-t 1"), "profiles[0].args"),
        (_profile(env={"A": 1}), "profiles[0].env.A"),
        (_profile(ram_mib=2**70), "profiles[0].ram_mib"),
        (_profile(idle_timeout=-1.0), "profiles[0].idle_timeout"),
        (_profile(weights={"url": "/m.gguf", "sha256": "abc", "size": 10}), "profiles[0].weights.sha256"),
        (_profile(weights={"url": "/m.gguf", "sha256": "a" * 64}), "profiles[0].weights.size"),
        ({**_profile(), "default_profile": "gpu"}, "default_profile"),
    ],
)
async def test_bad_models_name_the_field_and_write_nothing(daemon: Daemon, doc: dict[str, Any], field: str) -> None:
    error(await daemon.admin.post("/models", json=doc), 400, field)
    assert await daemon.tenancy.store.list_models() == []
    assert (await daemon.admin.get("/models")).json()["models"] == []


async def test_model_conflicts(tmp_path: Path) -> None:
    async with running_control(tmp_path, models=[model_doc("fromfile")]) as d:
        assert (await d.admin.get("/models/fromfile")).json()["source"] == "config"
        for response in (
            await d.admin.post("/models", json=model_doc("fromfile")),
            await d.admin.put("/models/fromfile", json=model_doc("fromfile")),
            await d.admin.delete("/models/fromfile"),
        ):
            assert error(response, 409, "name")["code"] == "defined_in_config"
        assert (await d.admin.post("/models", json=model_doc())).status_code == 201
        error(await d.admin.post("/models", json=model_doc()), 409, "name")
        error(await d.admin.put("/models/tiny", json=model_doc("other")), 400, "name")
        # A bad replacement changes nothing, in the store or in the catalog.
        error(await d.admin.put("/models/tiny", json=model_doc(parallel=0)), 400, "profiles[0].parallel")
        assert (await d.tenancy.store.get_model("tiny")).document["profiles"][0]["parallel"] == 2
        assert d.fleet.catalog.models["tiny"].profiles[0].parallel == 2
        error(await d.admin.put("/models/nothing", json=model_doc("nothing")), 404)
        assert [m.name for m in await d.tenancy.store.list_models()] == ["tiny"]
