"""GET /api/v1/replicas/{id}/logs: asked of the node over the agent socket, followed by long poll,
and a failed start's last lines kept with the failure (issue 19)."""

from __future__ import annotations

import trio

from llmgw_shared.wire import GetReplicaLogs

from .conftest import Daemon, fake_node, model_doc, wait_until
from .test_api_fleet import ready_replicas
from .test_api_tenancy import error


async def test_a_replicas_logs_come_from_its_node_and_can_be_followed(daemon: Daemon) -> None:
    assert (await daemon.admin.post("/models", json=model_doc(min_replicas=1))).status_code == 201
    async with fake_node(daemon, "n1") as node:
        (replica,) = await ready_replicas(daemon, "tiny:cpu")
        rid = replica["id"]
        node.logs[rid] = [f"line {i}" for i in range(10)]
        answer = (await daemon.admin.get(f"/replicas/{rid}/logs", params={"lines": "3"})).json()
        assert answer["lines"] == ["line 7", "line 8", "line 9"]
        assert answer["source"] == "node" and answer["node"] == "n1" and answer["model"] == "tiny:cpu"
        asked = [c for c in node.commands if isinstance(c, GetReplicaLogs)]
        assert asked[-1].replica_id == rid and asked[-1].lines == 3
        # Default: 100 lines.
        assert len((await daemon.admin.get(f"/replicas/{rid}/logs")).json()["lines"]) == 10

        # Follow: the poll is held until the engine writes something.
        cursor = answer["cursor"]
        got: list[dict[str, object]] = []

        async def follow() -> None:
            response = await daemon.admin.get(f"/replicas/{rid}/logs", params={"cursor": cursor, "wait": "true"})
            got.append(response.json())

        def polls() -> int:
            return sum(isinstance(c, GetReplicaLogs) and c.cursor == cursor for c in node.commands)

        async def asked_again() -> bool:
            return polls() >= 2

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            # The held poll asked the node, found nothing and asked again: it is held, not answered.
            await wait_until(asked_again)
            assert not got  # nothing new yet: still held
            node.logs[rid].append("a new line")
        assert got[0]["lines"] == ["a new line"]
        # Without wait, an empty answer comes at once.
        again = await daemon.admin.get(f"/replicas/{rid}/logs", params={"cursor": got[0]["cursor"]})
        assert again.json()["lines"] == []


async def test_bad_log_queries_are_refused_in_the_admin_shape(daemon: Daemon) -> None:
    error(await daemon.admin.get("/replicas/nope/logs"), 404)
    assert (await daemon.admin.post("/models", json=model_doc(min_replicas=1))).status_code == 201
    async with fake_node(daemon, "n1") as node:
        (replica,) = await ready_replicas(daemon, "tiny:cpu")
        rid = replica["id"]
        for params, field in (
            ({"lines": "0"}, "lines"),
            ({"lines": "1001"}, "lines"),
            ({"lines": "ten"}, "lines"),
            ({"lines": "-5"}, "lines"),
            ({"lines": "9" * 50}, "lines"),
            ({"cursor": "../x"}, "cursor"),
            ({"wait": "maybe"}, "wait"),
            ({"follow": "true"}, "follow"),
        ):
            error(await daemon.admin.get(f"/replicas/{rid}/logs", params=params), 400, field)
        # The node has no output for it (and no failure was reported): 404 saying so.
        body = error(await daemon.admin.get(f"/replicas/{rid}/logs"), 404)
        assert "no output" in body["message"]
        node.logs[rid] = []
        assert (await daemon.admin.get(f"/replicas/{rid}/logs")).json()["lines"] == []

    # The node is gone and nothing was reported with a failure: 503, in the admin shape.
    async def disconnected() -> bool:
        return "n1" not in daemon.fleet.agents.sessions

    await wait_until(disconnected)
    error(await daemon.admin.get(f"/replicas/{rid}/logs"), 503)


async def test_a_failed_starts_last_lines_are_shown_with_the_failure(daemon: Daemon) -> None:
    last = [
        "llama_model_load: error loading model: tensor 'blk.0' has wrong shape",
        "main: exiting due to model loading error",
    ]
    assert (await daemon.admin.post("/models", json=model_doc(min_replicas=1))).status_code == 201
    async with fake_node(daemon, "n1") as node:
        node.fail_with = last

        async def failed_once() -> bool:
            return bool(daemon.fleet.reconciler.ended)

        await wait_until(failed_once)
        rid = next(iter(daemon.fleet.reconciler.ended))
        # Forgotten by the reconciler (a replacement is due), its failure still answers for it.
        answer = (await daemon.admin.get(f"/replicas/{rid}/logs")).json()
        assert answer["source"] == "failure report" and answer["lines"] == last
        assert answer["status"] == "failed" and "exited with status 1" in answer["detail"]
