"""Control's own spans: reconcile passes and the node commands they send, exported by the SDK's
OTLP/HTTP exporter to a loopback receiver (tests/support/otlp.py), a scripted node on the wire."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import trio
from trio_websocket import open_websocket_url

from llmgw_control.app import run_control
from llmgw_control.catalog import ModelConfig, ProfileConfig, WeightsConfig
from llmgw_control.config import ControlConfig, validate
from llmgw_control.fleet.agents import AgentsConfig, token_digest
from llmgw_shared import tracing as shared_tracing
from llmgw_shared.facts import unprobed
from llmgw_shared.tracing import TracingConfig
from llmgw_shared.wire import PROTOCOL_VERSION, TRACE_CONTEXT, EngineState, Hello, ReplicaState, encode
from support.otlp import http_receiver

TOKEN = "llmgw-join-trace-token"


@pytest.fixture(autouse=True)
def export_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_tracing, "_EXPORT_EVERY", 0.05)


@pytest.mark.slow  # a control daemon with its agent listener, a few seconds
async def test_reconcile_passes_and_node_commands_are_spans(tmp_path: Path) -> None:
    async with http_receiver() as receiver, trio.open_nursery() as nursery:
        config = validate(
            ControlConfig(
                listen="127.0.0.1:0",
                admin_listen="127.0.0.1:0",
                data_dir=str(tmp_path),
                agents=AgentsConfig(listen="127.0.0.1:0", join_token_digests=[token_digest(TOKEN)]),
                tracing=TracingConfig(endpoint=receiver.url),
            )
        )
        listening = await nursery.start(lambda task_status: run_control(config, task_status=task_status))
        assert listening.agent_url is not None
        url = listening.agent_url.replace("http://", "ws://") + "/agent/v1"
        facts = attrs.evolve(unprobed(), probed=True, hostname="n1", ram_total_mib=4096)
        async with open_websocket_url(url) as ws:
            await ws.send_message(
                encode(
                    Hello(
                        PROTOCOL_VERSION,
                        "n1",
                        TOKEN,
                        facts,
                        [EngineState("llama.cpp", "b11312", "absent")],
                        # A replica control never placed: the pass stops it.
                        [ReplicaState("stray-0", "ready", port=9000, pid=4242)],
                    )
                )
            )
            with trio.fail_after(5):
                assert json.loads(await ws.get_message())["type"] == "welcome"
                engines = json.loads(await ws.get_message())
                # A hello that does not name trace_context (a node older than it): no traceparent.
                assert engines["type"] == "set_engines" and "traceparent" not in engines
            spans = await receiver.wait_for(
                lambda s: any(x.name == "llmgw.node_command" for x in s) and any(x.name == "llmgw.reconcile" for x in s)
            )
        nursery.cancel_scope.cancel()
    (command,) = [s for s in spans if s.name == "llmgw.node_command" and s.attributes["llmgw.command"] != "SetEngines"]
    assert command.service == "llmgw-control"
    assert command.attributes["llmgw.node"] == "n1" and command.attributes["llmgw.command"] in (
        "StopReplica",
        "DrainReplica",
    )
    assert command.attributes["llmgw.sent"] is True
    passes = [s for s in spans if s.name == "llmgw.reconcile"]
    assert all(isinstance(p.attributes["llmgw.pass"], int) for p in passes)
    # A command sent by a pass is that pass's child.
    (parent,) = [p for p in passes if p.span_id == command.parent_span_id]
    assert parent.trace_id == command.trace_id
    assert not any(TOKEN in str(v) for s in spans for v in s.attributes.values())


@pytest.mark.slow  # a control daemon with its agent listener, a few seconds
async def test_a_placement_is_an_event_of_its_pass_and_the_start_command_its_child(tmp_path: Path) -> None:
    profile = ProfileConfig(
        name="cpu",
        weights=WeightsConfig("http://files.example/m.gguf", "a" * 64, 1000),
        min_replicas=1,
        context=512,
        parallel=2,
    )
    async with http_receiver() as receiver, trio.open_nursery() as nursery:
        config = validate(
            ControlConfig(
                listen="127.0.0.1:0",
                admin_listen="127.0.0.1:0",
                data_dir=str(tmp_path),
                agents=AgentsConfig(listen="127.0.0.1:0", join_token_digests=[token_digest(TOKEN)]),
                models=[ModelConfig("m", [profile])],
                tracing=TracingConfig(endpoint=receiver.url),
            )
        )
        listening = await nursery.start(lambda task_status: run_control(config, task_status=task_status))
        assert listening.agent_url is not None
        url = listening.agent_url.replace("http://", "ws://") + "/agent/v1"
        facts = attrs.evolve(unprobed(), probed=True, hostname="n1", ram_total_mib=16000)
        async with open_websocket_url(url) as ws:
            await ws.send_message(
                encode(
                    Hello(
                        PROTOCOL_VERSION,
                        "n1",
                        TOKEN,
                        facts,
                        [EngineState("llama.cpp", "b11312", "installed")],
                        [],
                        features=[TRACE_CONTEXT],
                    )
                )
            )
            with trio.fail_after(10):
                while (frame := json.loads(await ws.get_message()))["type"] != "start_shard":
                    if frame["type"] == "set_engines":
                        engines = frame
            replica_id = frame["shard"]["shard_id"]
            spans = await receiver.wait_for(
                lambda s: any(
                    x.name == "llmgw.node_command" and x.attributes["llmgw.command"] == "StartReplica" for x in s
                )
            )
        nursery.cancel_scope.cancel()
    (command,) = [
        s for s in spans if s.name == "llmgw.node_command" and s.attributes["llmgw.command"] == "StartReplica"
    ]
    assert command.attributes["llmgw.command_id"] == frame["id"]
    # The node (its hello names trace_context) is sent the command span's context: its replica
    # start span is that span's child (tests/node/test_tracing_node.py).
    assert frame["traceparent"][:-3] == f"00-{command.trace_id}-{command.span_id}"
    assert int(frame["traceparent"][-2:], 16) & 1  # sampled
    (connect,) = [s for s in spans if s.name == "llmgw.node_command" and s.attributes["llmgw.command"] == "SetEngines"]
    assert engines["traceparent"][:-3] == f"00-{connect.trace_id}-{connect.span_id}"
    (placing,) = [s for s in spans if s.name == "llmgw.reconcile" and s.span_id == command.parent_span_id]
    assert placing.trace_id == command.trace_id
    placements = [attributes for name, attributes in placing.events if name == "llmgw.placement"]
    assert placements == [
        {
            "llmgw.action": "start",
            "llmgw.node": "n1",
            "gen_ai.request.model": "m",
            "llmgw.profile": "m:cpu",
            "llmgw.replica": replica_id,
        }
    ]
