"""The admin API of a standby: the leader's fleet from the store, fleet writes refused naming the
leader, store-only writes working. Two control daemons on a real PostgreSQL, as processes
(``support.failover``); the replica test also runs a node and the real engine.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import trio

from llmgw_control.ctl import main as ctl
from llmgw_control.store import open_store
from llmgw_dev.build_engine import ensure_engine
from support.failover import Control, control_pair
from support.waiting import wait_until

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def engine_archive(llama_server_binary: Path) -> Path:
    return ensure_engine()


def assert_standby_refusal(answer: httpx2.Response, leader: Control) -> None:
    """409 ``standby`` in the admin error shape, the leader's address in the body and the header."""
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert error["code"] == "standby"
    assert error["leader"] == leader.agent_ws
    assert leader.agent_ws in error["message"]
    assert answer.headers["x-llmgw-leader"] == leader.agent_ws


async def test_a_standby_refuses_fleet_writes_naming_the_leader_and_store_writes_work(
    tmp_path: Path, pg_url: str
) -> None:
    async with control_pair(tmp_path, pg_url) as pair:
        c1, c2 = pair.controls
        async with (
            httpx2.AsyncClient(base_url=c2.admin_url, timeout=10) as standby,
            httpx2.AsyncClient(base_url=c1.admin_url, timeout=10) as leader,
        ):
            # A node identity in the store, as onboarding writes it (its release files are not
            # built here), and store-only writes on the standby: a group and a key.
            async with open_store(pg_url) as store:
                await store.add_node("n1", "digest-of-a-join-token", {"zone": "a"})
            group = (await standby.post("/api/v1/groups", json={"name": "team"})).json()["group"]
            made = await standby.post("/api/v1/keys", json={"name": "app", "group_id": group["id"]})
            assert made.status_code == 201, made.text

            # Reads say whose fleet they show: the standby's is the leader's, from the store.
            listed = await standby.get("/api/v1/nodes")
            assert listed.status_code == 200, listed.text
            assert listed.headers["x-llmgw-leader"] == c1.agent_ws
            body = listed.json()
            assert (body["role"], body["leader"]) == ("standby", c1.agent_ws)
            assert [(n["id"], n["state"], n["labels"]) for n in body["nodes"]] == [("n1", "registered", {"zone": "a"})]
            one = await standby.get("/api/v1/nodes/n1")
            assert one.status_code == 200 and one.json()["node"]["id"] == "n1"
            assert (await standby.get("/api/v1/nodes/nope")).status_code == 404
            on_leader = (await leader.get("/api/v1/nodes")).json()
            assert (on_leader["role"], on_leader["leader"]) == ("leader", None)
            assert "x-llmgw-leader" not in (await leader.get("/api/v1/nodes")).headers

            # Fleet writes: refused on the standby, naming the leader, and nothing changed.
            for path in (
                "/api/v1/nodes/n1/drain",
                "/api/v1/nodes/n1/cordon",
                "/api/v1/nodes/n1/uncordon",
                "/api/v1/nodes/unknown/drain",
            ):
                assert_standby_refusal(await standby.post(path), c1)
            assert_standby_refusal(await standby.post("/api/v1/capacity/runs", json={"model": "tiny"}), c1)
            assert_standby_refusal(await standby.get("/api/v1/weights"), c1)
            node = (await leader.get("/api/v1/nodes/n1")).json()["node"]
            assert node["cordoned"] is False

            # ctl says it in one line that names the leader, and exits non-zero.
            out, err = io.StringIO(), io.StringIO()
            code = await trio.to_thread.run_sync(
                lambda: ctl(["--admin", c2.admin_url, "nodes", "drain", "n1"], stdout=out, stderr=err)
            )
            assert code != 0 and out.getvalue() == ""
            (line,) = err.getvalue().splitlines()
            assert "standby" in line and c1.agent_ws in line
            listing = io.StringIO()
            assert (
                await trio.to_thread.run_sync(
                    lambda: ctl(["--admin", c2.admin_url, "nodes", "list"], stdout=listing, stderr=err)
                )
                == 0
            )
            assert f"leader: {c1.agent_ws}" in listing.getvalue().splitlines()[0]

            # The leader does them.
            cordoned = await leader.post("/api/v1/nodes/n1/cordon")
            assert cordoned.status_code == 200 and cordoned.json()["node"]["cordoned"] is True
            assert (await standby.get("/api/v1/nodes/n1")).json()["node"]["cordoned"] is True

        # The key made on the standby is accepted by the leader (one digest secret, one store).
        async with httpx2.AsyncClient(base_url=c1.api_url, timeout=10) as client:
            accepted = await client.get("/v1/models", headers={"authorization": f"Bearer {made.json()['secret']}"})
            assert accepted.status_code == 200, accepted.text


def chat(control: Control) -> Any:
    client = openai.OpenAI(base_url=control.api_url + "/v1", api_key="none", max_retries=0, timeout=60)
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


async def replicas_of(control: Control) -> dict[str, Any]:
    async with httpx2.AsyncClient(base_url=control.admin_url, timeout=10) as admin:
        answer = await admin.get("/api/v1/replicas")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body


@pytest.mark.engine
async def test_a_standby_lists_the_leaders_replicas_and_a_drain_there_changes_nothing(
    tmp_path: Path, pg_url: str, tiny_model: Path, engine_archive: Path
) -> None:
    async with control_pair(tmp_path, pg_url, tiny_model=tiny_model, engine_archive=engine_archive) as pair:
        c1, c2 = pair.controls
        await pair.add_node("n1", c1)
        answer = await trio.to_thread.run_sync(chat, c1)  # a cold start on the leader
        assert answer.usage.completion_tokens == 4
        (on_leader,) = (await replicas_of(c1))["replicas"]
        assert on_leader["status"] == "ready" and on_leader["node"] == "n1"

        # The standby follows the view within a poll or two, and learns the replica's node once the
        # leader has written down the nodes holding replicas (within a second of a change): wait on
        # what it says, not on time.
        async def on_n1() -> Any:
            seen = await replicas_of(c2)
            return seen if [r["node"] for r in seen["replicas"]] == ["n1"] else None

        seen = await wait_until(on_n1, timeout=15, interval=0.1)
        assert (seen["role"], seen["leader"]) == ("standby", c1.agent_ws)
        (on_standby,) = seen["replicas"]
        assert (
            on_standby["id"],
            on_standby["model"],
            on_standby["node"],
            on_standby["port"],
            on_standby["status"],
        ) == (on_leader["id"], on_leader["model"], "n1", on_leader["port"], "ready")
        async with httpx2.AsyncClient(base_url=c2.admin_url, timeout=10) as standby:
            nodes = (await standby.get("/api/v1/nodes")).json()
            assert [(n["id"], [s["id"] for s in n["shards"]]) for n in nodes["nodes"]] == [("n1", [on_leader["id"]])]
            models = (await standby.get("/api/v1/models")).json()["models"]
            tiny = next(m for m in models if m["model"] == "tiny")
            assert tiny["ready"] == 1 and [r["id"] for r in tiny["replicas"]] == [on_leader["id"]]

            assert_standby_refusal(await standby.post("/api/v1/nodes/n1/drain"), c1)
            assert_standby_refusal(await standby.get(f"/api/v1/replicas/{on_leader['id']}/logs"), c1)

        # Nothing changed on the leader: the replica is still ready and not draining, n1 not cordoned.
        (after,) = (await replicas_of(c1))["replicas"]
        assert (after["id"], after["status"], after["draining"]) == (on_leader["id"], "ready", False)
        async with httpx2.AsyncClient(base_url=c1.admin_url, timeout=10) as leader:
            assert (await leader.get("/api/v1/nodes/n1")).json()["node"]["cordoned"] is False
