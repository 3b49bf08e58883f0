"""Every ``llmgw-control ctl`` command against a live daemon (in-process; the CLI runs in a worker
thread, since it is synchronous and the daemon shares this test's trio loop)."""

from __future__ import annotations

import io
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from system.releases import fake_release

from llmgw_control.ctl import main as ctl
from llmgw_control.store import Usage
from llmgw_shared.facts import GpuFacts
from support.waiting import wait_until

from .conftest import PROVENANCE, Daemon, fake_node, model_doc
from .test_api_fleet import AVX2, ready_replicas


@attrs.frozen
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def run(d: Daemon, *argv: str) -> Ran:
    out, err = io.StringIO(), io.StringIO()
    code = await trio.to_thread.run_sync(lambda: ctl(["--admin", d.admin_url, *argv], stdout=out, stderr=err))
    return Ran(code, out.getvalue(), err.getvalue())


async def ok(d: Daemon, *argv: str) -> Ran:
    ran = await run(d, *argv)
    assert ran.code == 0 and ran.err == "", ran
    return ran


async def test_nodes_show_engine_states_and_warnings_and_cordon_drain_uncordon(daemon: Daemon) -> None:
    assert "no nodes" in (await ok(daemon, "nodes")).out
    await daemon.admin.post("/models", json=model_doc(min_replicas=1))
    async with fake_node(daemon, "n1", warnings=[AVX2]):
        (replica,) = await ready_replicas(daemon, "tiny:cpu")
        listed = (await ok(daemon, "nodes", "list")).out
        header, row, warning = listed.splitlines()
        assert header.split()[:3] == ["NODE", "STATE", "CORDONED"]
        assert row.split()[:3] == ["n1", "ready", "no"] and "llama.cpp b11312: installed b11312" in row
        assert warning == f"warning: node n1: {AVX2}"
        assert (await ok(daemon, "--json", "nodes")).json()["nodes"][0]["warnings"] == [AVX2]

        assert "cordoned" in (await ok(daemon, "nodes", "cordon", "n1")).out
        assert daemon.fleet.reconciler.is_cordoned("n1")
        assert "uncordoned" in (await ok(daemon, "nodes", "uncordon", "n1")).out
        drained = (await ok(daemon, "nodes", "drain", "n1")).out
        assert f"1 replica(s): {replica['id']}" in drained
        replicas = (await ok(daemon, "replicas", "--json")).json()["replicas"]
        assert all(not r["routable"] for r in replicas)

        missing = await run(daemon, "nodes", "cordon", "n9")
        assert missing.code == 1 and missing.out == ""
        assert missing.err == "error: node 'n9' not found (HTTP 404)\n"


async def test_a_degraded_node_says_so_in_its_row_a_warning_and_its_json(daemon: Daemon) -> None:
    why = "this node has NVIDIA GPUs but its llama.cpp engine is a CPU build"
    l4 = GpuFacts(index=0, name="NVIDIA L4", uuid="GPU-0", memory_total_mib=23034, memory_free_mib=22700)
    async with fake_node(daemon, "n1", gpus=[l4], degraded=why), fake_node(daemon, "n2", gpus=[l4]):
        await wait_until(lambda: len(daemon.fleet.inventory) >= 2, timeout=10)
        header, row1, row2, warning = (await ok(daemon, "nodes", "list")).out.splitlines()
        assert "GPUS" in header.split()
        assert "1 (cuda) DEGRADED: CPU only" in row1 and "DEGRADED" not in row2 and "1 (cuda)" in row2
        assert warning == (
            f"warning: node n1 is DEGRADED: {why}; GPU profiles are not placed there unless they say cpu_ok"
        )
        facts = {n["id"]: n["facts"] for n in (await ok(daemon, "--json", "nodes")).json()["nodes"]}
        assert (facts["n1"]["degraded"], facts["n1"]["gpu_backend"]) == (why, "cuda")
        assert facts["n2"]["degraded"] == ""


async def test_nodes_add_prints_the_token_once_and_the_install_command(daemon: Daemon, tmp_path: Path) -> None:
    # No node release to serve yet: onboarding's own reason, plainly.
    refused = await run(daemon, "nodes", "add", "gpu-3")
    assert refused.code == 1 and "llmgw-control release prepare" in refused.err and "(HTTP 409)" in refused.err
    # The daemon's data directory is tmp_path.
    fake_release(
        tmp_path / "node-releases",
        {f"{dist}-0.1.0-py3-none-any.whl": b"not really a wheel" for dist in ("llmgw_shared", "llmgw_node")},
    )

    ran = await ok(daemon, "nodes", "add", "gpu-3", "--label", "zone=a")
    lines = ran.out.splitlines()
    assert lines[0] == "node gpu-3 registered." and "shown only this once" in lines[1]
    token = lines[2].strip()
    assert token and "LLMGW_JOIN_TOKEN=" in lines[4] and token in lines[4]
    identity = await daemon.tenancy.store.get_node("gpu-3")
    assert dict(identity.labels) == {"zone": "a"} and token not in identity.token_digest
    again = await run(daemon, "nodes", "add", "gpu-3")
    assert again.code == 1 and "(HTTP 409)" in again.err
    bad = await run(daemon, "nodes", "add", "gpu-4", "--label", "nonsense")
    assert bad.code == 1 and "KEY=VALUE" in bad.err


async def test_models_add_from_toml_and_json_list_show_remove(daemon: Daemon, tmp_path: Path) -> None:
    toml = tmp_path / "tiny.toml"
    weights = model_doc()["profiles"][0]["weights"]
    toml.write_text(f"""
[[models]]
name = "tiny"
[[models.profiles]]
name = "cpu"
ram_mib = 100
weights = {{ url = "{weights["url"]}", sha256 = "{weights["sha256"]}", size = {weights["size"]} }}
""")
    assert (await ok(daemon, "models", "add", "--file", str(toml))).out == "model tiny added\n"
    as_json = tmp_path / "small.json"
    as_json.write_text(json.dumps(model_doc("small")))
    assert (await ok(daemon, "--json", "models", "add", "--file", str(as_json))).json()["source"] == "api"

    table = (await ok(daemon, "models")).out
    assert table.splitlines()[0].split()[:3] == ["MODEL", "SOURCE", "READY"]
    assert any(line.startswith("tiny:cpu") and " api " in line for line in table.splitlines())
    assert (await ok(daemon, "models", "show", "tiny")).json()["model"]["name"] == "tiny"

    as_json.write_text(json.dumps(model_doc("small", context=512)))
    assert "changed" in (await ok(daemon, "models", "change", "--file", str(as_json))).out
    assert daemon.fleet.catalog.models["small"].profiles[0].context == 512

    duplicate = await run(daemon, "models", "add", "--file", str(toml))
    assert duplicate.code == 1 and "already exists (HTTP 409)" in duplicate.err
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(model_doc("x", context="big")))
    bad = await run(daemon, "models", "add", "--file", str(broken))
    assert bad.code == 1 and "profiles[0].context" in bad.err
    assert (await run(daemon, "models", "add", "--file", str(tmp_path / "none.toml"))).code == 1

    assert "removed" in (await ok(daemon, "models", "remove", "tiny")).out
    assert "tiny" not in daemon.fleet.catalog.models
    assert (await run(daemon, "models", "remove", "tiny")).code == 1


async def test_replicas_and_engines(daemon: Daemon) -> None:
    assert (await ok(daemon, "replicas")).out == "no replicas\n"
    await daemon.admin.post("/models", json=model_doc(min_replicas=1))
    async with fake_node(daemon, "n1"):
        await ready_replicas(daemon, "tiny:cpu")
        row = (await ok(daemon, "replicas")).out.splitlines()[1].split()
        assert row[1:5] == ["tiny:cpu", "n1", "20000", "yes"]
        engines = (await ok(daemon, "engines")).out.splitlines()
        assert engines[0].split() == ["ENGINE", "VERSION", "NODE", "STATE", "PROVENANCE"]
        assert engines[1].split()[:5] == ["llama.cpp", "b11312", "n1", "installed", "b11312"]
        # Where each node's install came from: the index, who signed it, the archive's digest,
        # when, and the control epoch that asked.
        assert engines[1].endswith(f"  {PROVENANCE.describe()}")
        assert PROVENANCE.describe() == (
            "from http://10.0.0.1:8443/releases/llama.cpp/b11312 (signed by 0123456789ABCDEF): "
            "llama-b11312-bin-ubuntu-x64.tar.gz sha256:cdcdcdcdcdcdcdcd…; installed 2026-11-30 00:53:20Z, "
            "control epoch 3"
        )
        listed = (await ok(daemon, "--json", "engines")).json()["engines"][0]["nodes"][0]
        assert listed["provenance"]["assets"][0]["sha256"] == "cd" * 32


async def test_groups_keys_quotas_by_path(daemon: Daemon) -> None:
    assert "created" in (await ok(daemon, "groups", "create", "org")).out
    assert "org/team" in (await ok(daemon, "groups", "create", "team", "--parent", "org")).out
    assert [line.split()[0] for line in (await ok(daemon, "groups")).out.splitlines()[1:]] == ["org", "org/team"]

    created = await ok(
        daemon,
        "keys",
        "create",
        "ci",
        "--group",
        "org/team",
        "--model",
        "tiny",
        "--admin-key",
        "--expires",
        "2099-01-01T00:00:00Z",
    )
    secret = created.out.splitlines()[2].strip()
    assert secret.startswith("sk-llmgw-")
    key_id = created.out.split()[1]
    listed = (await ok(daemon, "keys", "--group", "org/team")).out
    assert secret not in listed and key_id in listed and "active" in listed and "tiny" in listed
    assert "revoked" in (await ok(daemon, "keys", "revoke", key_id)).out
    assert "revoked" in (await ok(daemon, "keys", "list")).out
    assert (await ok(daemon, "--json", "keys")).json()["keys"][0]["state"] == "revoked"
    assert "deleted" in (await ok(daemon, "keys", "delete", key_id)).out
    assert (await ok(daemon, "keys")).out == "no keys\n"

    set_ = await ok(daemon, "quotas", "set", "org/team", "--tokens-per-minute", "1000", "--concurrent-requests", "2")
    assert set_.out == "quota of org/team set: tokens_per_minute 1000, concurrent_requests 2\n"
    quotas = (await ok(daemon, "quotas")).out.splitlines()
    assert quotas[1].split() == ["org/team", "-", "1000", "-", "2"]
    negative = await run(daemon, "quotas", "set", "org", "--requests-per-minute", "-5")
    assert negative.code == 1 and "requests_per_minute" in negative.err
    assert "cleared" in (await ok(daemon, "quotas", "clear", "org/team")).out
    assert (await ok(daemon, "quotas", "list")).out == "no quotas\n"

    in_use = await run(daemon, "groups", "delete", "org")
    assert in_use.code == 1 and "(HTTP 409)" in in_use.err
    assert "deleted" in (await ok(daemon, "groups", "delete", "org/team")).out
    unknown = await run(daemon, "groups", "delete", "org/nothing")
    assert unknown.code == 1 and "no group" in unknown.err


async def test_usage_with_filters(daemon: Daemon) -> None:
    await ok(daemon, "groups", "create", "org")
    group_id = (await daemon.admin.get("/groups")).json()["groups"][0]["id"]
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    await daemon.tenancy.store.add_usage(
        [Usage(hour, "k1", group_id, "tiny", 3, 30, 12), Usage(hour, "k2", group_id, "big", 1, 5, 5)]
    )
    table = (await ok(daemon, "usage", "--group", "org", "--model", "tiny")).out.splitlines()
    assert table[1].split()[1:] == ["org", "k1", "tiny", "3", "30", "12"]  # groups by path
    assert table[-1].split() == ["total", "3", "30", "12"]
    # Options before or after the verb.
    shown = await ok(daemon, "--json", "usage", "--key", "k2", "show", "--since", hour.isoformat())
    assert shown.json()["totals"] == {"requests": 1, "prompt_tokens": 5, "completion_tokens": 5}
    bad = await run(daemon, "usage", "--since", "last week")
    assert bad.code == 1 and "since" in bad.err


async def test_an_unreachable_admin_api_is_said_plainly() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = await trio.to_thread.run_sync(
        lambda: ctl(["--admin", "http://127.0.0.1:9", "nodes"], stdout=out, stderr=err)
    )
    assert code == 1 and "cannot reach the admin API at http://127.0.0.1:9" in err.getvalue()


@pytest.mark.slow  # left out of the quick tier: the daemon's command line as a process
async def test_the_daemon_command_line_hands_ctl_over(daemon: Daemon) -> None:
    # Through the real entry point, as an operator types it.
    result = await trio.run_process(
        [str(Path(sys.executable).parent / "llmgw-control"), "ctl", "--admin", daemon.admin_url, "--json", "nodes"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"nodes": [], "role": "leader", "leader": None}


async def test_replicas_logs_prints_the_engines_lines_and_follows(daemon: Daemon) -> None:
    import argparse

    from llmgw_control.ctl.client import AdminClient
    from llmgw_control.ctl.replica_cmds import replicas_logs

    await daemon.admin.post("/models", json=model_doc(min_replicas=1))
    async with fake_node(daemon, "n1") as node:
        (replica,) = await ready_replicas(daemon, "tiny:cpu")
        node.logs[replica["id"]] = ["main: loading model", "main: server is listening"]
        ran = await ok(daemon, "replicas", "logs", replica["id"], "-n", "1")
        assert ran.out == "main: server is listening\n"
        assert (await ok(daemon, "--json", "replicas", "logs", replica["id"])).json()["lines"] == node.logs[
            replica["id"]
        ]
        bad = await run(daemon, "replicas", "logs", replica["id"], "--lines", "0")
        assert bad.code == 1 and "between 1 and 1000" in bad.err
        assert (await run(daemon, "replicas", "logs", "nope")).code == 1

        out = io.StringIO()
        args = argparse.Namespace(replica=replica["id"], lines=10, follow=True, json=False)

        def follow() -> None:
            with AdminClient(daemon.admin_url) as client:
                replicas_logs(client, args, out, polls=1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, follow)
            await wait_until(lambda: "server is listening" in out.getvalue(), timeout=10)
            node.logs[replica["id"]].append("srv  update_slots: all slots are idle")
        assert out.getvalue().splitlines()[-1] == "srv  update_slots: all slots are idle"
