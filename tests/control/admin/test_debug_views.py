"""/debug/tasks and /debug/gc: on the admin listener only, behind its key guard (issue 19)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import trio
import trio.lowlevel

from .conftest import running_control
from .test_admin_key import REQUIRE, admin_keys


async def parked_somewhere_recognisable(event: trio.Event) -> None:
    await event.wait()


def find(node: dict[str, Any], name: str) -> dict[str, Any] | None:
    if node["name"] == name:
        return node
    for children in node["nurseries"]:
        for child in children:
            if (found := find(child, name)) is not None:
                return found
    return None


async def test_the_task_dump_shows_every_task_with_its_stack(tmp_path: Path) -> None:
    release = trio.Event()
    async with (
        running_control(tmp_path) as daemon,
        trio.open_nursery() as nursery,
        httpx2.AsyncClient(base_url=daemon.admin_url, timeout=10) as client,
    ):
        # The daemon runs in this test's trio loop, so a task started here is in its tree.
        nursery.start_soon(parked_somewhere_recognisable, release, name="h19-known-task")
        await trio.lowlevel.checkpoint()
        dump = (await client.get("/debug/tasks")).json()
        assert dump["count"] > 5 and dump["omitted"] == 0
        task = find(dump["task"], "h19-known-task")
        assert task is not None
        assert any(
            "parked_somewhere_recognisable" in frame and "test_debug_views.py" in frame for frame in task["stack"]
        ), task["stack"]
        # The daemon's own tasks are there too, each where it waits.
        assert any("run_control" in frame for frame in _all_frames(dump["task"]))
        text = (await client.get("/debug/tasks", params={"format": "text"})).text
        assert "h19-known-task" in text and "parked_somewhere_recognisable" in text
        assert text.rstrip().endswith("task(s)")
        assert (await client.get("/debug/tasks", params={"format": "xml"})).status_code == 400
        assert (await client.get("/debug/tasks", params={"depth": "9"})).status_code == 400

        state = (await client.get("/debug/gc")).json()
        assert len(state["count"]) == 3 and len(state["thresholds"]) == 3
        assert [set(s) for s in state["stats"]] == [{"collections", "collected", "uncollectable"}] * 3
        assert isinstance(state["enabled"], bool) and state["frozen"] >= 0
        assert (await client.get("/debug/gc", params={"x": "1"})).json()["error"]["field"] == "x"

        # The client listener serves neither, not even under the dashboard's /admin prefix.
        async with httpx2.AsyncClient(base_url=daemon.listening.api_url, timeout=10) as public:
            for path in (
                "/debug/tasks",
                "/debug/gc",
                "/admin/debug/tasks",
                "/admin/api/v1/../../debug/tasks",
                "/admin/api/v1/debug/tasks",
            ):
                response = await public.get(path)
                assert response.status_code in (401, 404), (path, response.status_code)
                assert "h19-known-task" not in response.text and "thresholds" not in response.text
        release.set()


def _all_frames(node: dict[str, Any]) -> list[str]:
    out = list(node["stack"])
    for children in node["nurseries"]:
        for child in children:
            out.extend(_all_frames(child))
    return out


async def test_the_dumps_need_an_admin_key_like_the_rest_of_the_admin_listener(tmp_path: Path) -> None:
    keys = await admin_keys(tmp_path)
    async with (
        running_control(tmp_path, control_settings=REQUIRE) as daemon,
        httpx2.AsyncClient(base_url=daemon.admin_url, timeout=10) as client,
    ):
        for path in ("/debug/tasks", "/debug/gc"):
            for headers in ({}, {"authorization": f"Bearer {keys['plain']}"}, {"authorization": "Bearer sk-no"}):
                response = await client.get(path, headers=headers)
                assert response.status_code == 401, (path, response.text)
                assert "thresholds" not in response.text and "stack" not in response.text
            good = await client.get(path, headers={"authorization": f"Bearer {keys['admin']}"})
            assert good.status_code == 200
