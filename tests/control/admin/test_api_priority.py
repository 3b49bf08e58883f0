"""A group's priority through the admin API and ctl: set, inherited down the tree, cleared, refused when bad."""

from __future__ import annotations

import pytest

from .conftest import Daemon
from .test_api_tenancy import error, make_group
from .test_ctl import ok, run


async def test_priority_is_set_inherited_and_cleared(daemon: Daemon) -> None:
    org = (await daemon.admin.post("/groups", json={"name": "org", "priority": "batch"})).json()["group"]
    assert org["priority"] == "batch" and org["effective_priority"] == "batch"
    team = await make_group(daemon, "team", org["id"])
    got = (await daemon.admin.get(f"/groups/{team}")).json()["group"]
    assert got["priority"] is None and got["effective_priority"] == "batch"  # from its parent
    patched = (await daemon.admin.patch(f"/groups/{team}", json={"priority": "interactive"})).json()["group"]
    assert patched["effective_priority"] == "interactive"
    # Absent: unchanged; null: inherit again.
    assert (await daemon.admin.patch(f"/groups/{team}", json={"name": "squad"})).json()["group"][
        "priority"
    ] == "interactive"
    cleared = (await daemon.admin.patch(f"/groups/{team}", json={"priority": None})).json()["group"]
    assert cleared["priority"] is None and cleared["effective_priority"] == "batch"
    root = await make_group(daemon, "other")
    assert (await daemon.admin.get(f"/groups/{root}")).json()["group"]["effective_priority"] == "interactive"


@pytest.mark.parametrize("value", ["urgent", "", 3, ["batch"], "BATCH"])
async def test_a_bad_priority_is_refused_naming_the_field(daemon: Daemon, value: object) -> None:
    error(await daemon.admin.post("/groups", json={"name": "org", "priority": value}), 400, "priority")
    assert (await daemon.admin.get("/groups")).json()["groups"] == []
    org = await make_group(daemon, "org")
    error(await daemon.admin.patch(f"/groups/{org}", json={"priority": value}), 400, "priority")


async def test_ctl_sets_and_shows_priorities(daemon: Daemon) -> None:
    await ok(daemon, "groups", "create", "org", "--priority", "batch")
    await ok(daemon, "groups", "create", "team", "--parent", "org")
    rows = [line.split() for line in (await ok(daemon, "groups")).out.splitlines()[1:]]
    assert [(r[0], r[2:]) for r in rows] == [("org", ["batch"]), ("org/team", ["batch", "(inherited)"])]
    assert "priority interactive" in (await ok(daemon, "groups", "priority", "org/team", "interactive")).out
    assert "batch (inherited)" in (await ok(daemon, "groups", "priority", "org/team", "inherit")).out
    missing = await run(daemon, "groups", "priority", "org/nothing", "batch")
    assert missing.code == 1 and "no group" in missing.err
