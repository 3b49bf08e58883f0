"""What each node holds in its weights cache: GET /api/v1/weights and ``ctl weights [--node N]``."""

from __future__ import annotations

from llmgw_shared.wire import WeightsHeld

from .conftest import WEIGHTS_SHA, Daemon, fake_node, model_doc
from .test_api_fleet import ready_replicas
from .test_api_tenancy import error
from .test_ctl import ok, run

OLD = "ab" * 32
LAST_USED = 1_796_000_000.0  # 2026-11-30 00:53:20Z


async def test_weights_per_node_with_size_last_use_and_the_replicas_using_them(daemon: Daemon) -> None:
    cache = [WeightsHeld(WEIGHTS_SHA, 1_000_000, LAST_USED), WeightsHeld(OLD, 5 << 30, LAST_USED)]
    await daemon.admin.post("/models", json=model_doc(min_replicas=1))
    async with fake_node(daemon, "n1", weights=cache):
        await ready_replicas(daemon, "tiny:cpu")
        answer = (await daemon.admin.get("/weights")).json()
        (node,) = answer["nodes"]
        assert node["node"] == "n1" and node["reported"] is True
        files = {w["sha256"]: w for w in node["weights"]}
        assert files[OLD] == {
            "sha256": OLD,
            "size": 5 << 30,
            "last_used": "2026-11-30T00:53:20Z",
            "in_use": False,
            "models": [],
        }
        # The replica control placed there uses it (the fake node does not say so; control knows).
        used = files[WEIGHTS_SHA]
        assert used["in_use"] is True and used["models"] == ["tiny:cpu"]
        assert (await daemon.admin.get("/weights", params={"node": "n1"})).json() == answer
        error(await daemon.admin.get("/weights", params={"node": "n9"}), 404)

        table = (await ok(daemon, "weights")).out.splitlines()
        assert table[0].split() == ["NODE", "SHA256", "SIZE", "LAST", "USED", "USED", "BY"]
        rows = {line.split()[1]: line for line in table[1:]}
        assert rows[OLD[:16]].split()[2:] == ["5.0", "GiB", "2026-11-30T00:53:20Z", "-"]
        assert rows[WEIGHTS_SHA[:16]].split()[-3:] == ["in", "use", "tiny:cpu"]
        assert (await ok(daemon, "--json", "weights", "--node", "n1")).json() == answer
        assert (await ok(daemon, "weights", "list", "--node", "n1")).out.splitlines() == table
        missing = await run(daemon, "weights", "--node", "n9")
        assert missing.code != 0 and "n9" in missing.err
