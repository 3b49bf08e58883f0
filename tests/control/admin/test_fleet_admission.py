"""Who may join the fleet, on the real daemon's agent socket: closed unless the operator opens it, and
every name in a hello checked exactly as onboarding checks it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import attrs
import pytest

from llmgw_control.fleet.agents import token_digest
from llmgw_shared.facts import unprobed
from llmgw_shared.wire import PROTOCOL_VERSION, EngineState, Hello, ReplicaState, encode

from .conftest import JOIN_TOKEN, Daemon, fake_node, first_answer, running_control

OWN_TOKEN = "llmgw-join-gpu-3-own-token"


def hello(node_id: str, token: str, **fields: Any) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(
        encode(
            Hello(
                PROTOCOL_VERSION,
                node_id,
                token,
                attrs.evolve(unprobed(), probed=True),
                [EngineState("llama.cpp", "b11312", "installed")],
                # The claim the issue reports control adopting: a ready replica at an address of the node's choosing.
                [ReplicaState("tiny-cpu-0badc0de", "ready", port=8101)],
                address="10.9.9.9",
            )
        )
    )
    frame.update(fields)
    return frame


async def listed(daemon: Daemon) -> set[str]:
    return {n["id"] for n in (await daemon.admin.get("/nodes")).json()["nodes"]}


async def test_by_default_a_node_never_onboarded_is_refused_whatever_its_token(tmp_path: Path) -> None:
    # No shared join tokens configured: the state onboarding leaves.
    async with running_control(tmp_path, join_token_digests=[]) as daemon:
        for token in ("", "anything", JOIN_TOKEN, OWN_TOKEN):
            answer = await first_answer(daemon, json.dumps(hello("intruder", token)))
            assert answer["type"] == "refuse" and "bad join token" in answer["reason"], answer
        assert "intruder" not in await listed(daemon)
        assert daemon.fleet.inventory.get("intruder") is None
        assert daemon.fleet.reconciler.records == {}


async def test_an_onboarded_node_joins_with_its_own_token_and_no_other(tmp_path: Path) -> None:
    async with running_control(tmp_path, join_token_digests=[token_digest(JOIN_TOKEN)]) as daemon:
        await daemon.tenancy.store.add_node("gpu-3", token_digest(OWN_TOKEN))
        # Not with the shared token, and its token admits no other id.
        for node_id, token in (("gpu-3", JOIN_TOKEN), ("gpu-3", ""), ("gpu-4", OWN_TOKEN)):
            answer = await first_answer(daemon, json.dumps(hello(node_id, token)))
            assert answer["type"] == "refuse", (node_id, answer)
        assert "gpu-4" not in await listed(daemon)
        async with fake_node(daemon, "gpu-3", token=OWN_TOKEN):
            assert "gpu-3" in daemon.fleet.agents.sessions
        # A node id nobody onboarded may use the shared token (its digest is configured).
        async with fake_node(daemon, "gpu-5", token=JOIN_TOKEN):
            assert "gpu-5" in daemon.fleet.agents.sessions


async def test_an_open_fleet_is_a_setting_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        async with running_control(tmp_path, join_token_digests=[], open_fleet=True) as daemon:
            async with fake_node(daemon, "anyone", token="whatever"):
                assert "anyone" in daemon.fleet.agents.sessions
            await daemon.tenancy.store.add_node("gpu-3", token_digest(OWN_TOKEN))
            # Even open, an onboarded id accepts only its own token.
            assert (await first_answer(daemon, json.dumps(hello("gpu-3", "whatever"))))["type"] == "refuse"
    assert any("open_fleet is on" in r.getMessage() for r in caplog.records)


BAD_NODE_IDS = [
    "",
    "../..",
    "x" * 10_000,
    "a\nb",
    "n1\n",
    "a\x00b",
    "<script>alert(1)</script>",
    "a b",
    "-x",
    ".hidden",
    "ü",
]


@pytest.mark.parametrize("node_id", BAD_NODE_IDS)
async def test_a_hello_node_id_is_checked_as_onboarding_checks_it(daemon: Daemon, node_id: str) -> None:
    answer = await first_answer(daemon, json.dumps(hello(node_id, JOIN_TOKEN)))
    assert answer["type"] == "refuse", answer
    assert "node id" in answer["reason"] and "is not valid" in answer["reason"]
    # The id is shown cut and quoted, never raw.
    assert len(answer["reason"]) < 400 and "\n" not in answer["reason"] and "\x00" not in answer["reason"]
    assert await listed(daemon) == set()


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("address", "10.0.0.1:8000/x?", "address"),
        ("address", "user@10.0.0.1", "address"),
        ("address", "fe80::1%eth0", "address"),
        ("address", "a" * 300, "address"),
        ("engines", [{"name": "llama.cpp\n", "version": "b1", "status": "installed"}], "engine name"),
        ("engines", [{"name": "llama.cpp", "version": "../../b1", "status": "installed"}], "engine version"),
        ("shards", [{"shard_id": "../../etc/x", "status": "ready"}], "replica id"),
        ("shards", [{"shard_id": "s" * 200, "status": "ready"}], "replica id"),
        ("shards", [{"shard_id": "tiny-1", "status": "ready", "port": 70000}], "port"),
        ("shards", [{"shard_id": "tiny-1", "status": "failed", "detail": "x" * 100_000}], "longer than"),
        ("shards", [{"shard_id": "tiny-1", "status": "ready", "pid": -1}], "between 0"),
        ("shards", [{"shard_id": f"t-{i}", "status": "ready"} for i in range(1001)], "more than"),
    ],
)
async def test_every_name_in_a_hello_is_checked(daemon: Daemon, field: str, value: Any, words: str) -> None:
    answer = await first_answer(daemon, json.dumps(hello("n1", JOIN_TOKEN, **{field: value})))
    assert answer["type"] == "refuse" and words in answer["reason"], answer
    assert await listed(daemon) == set()


async def test_a_report_with_a_bad_name_is_an_error_frame_and_changes_nothing(daemon: Daemon) -> None:
    from llmgw_shared.wire import Heartbeat

    from .conftest import wait_until

    async with fake_node(daemon, "n1") as node:
        frame = json.loads(encode(Heartbeat(1)))
        frame["shards"] = [{"shard_id": "../../x", "status": "ready", "port": 8101}]
        await node.ws.send_message(json.dumps(frame))

        async def told() -> bool:
            return any("replica id" in e for e in node.errors)

        await wait_until(told)
        record = daemon.fleet.inventory.get("n1")
        assert record is not None and "../../x" not in record.replicas
        assert "n1" in daemon.fleet.agents.sessions
