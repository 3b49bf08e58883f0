"""The node's own spans (engine installs, replica starts), exported by the SDK's OTLP/HTTP exporter
to a loopback receiver (tests/support/otlp.py) when the node's [tracing] names it."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from node.helpers import next_engine_state, next_replica_state

from llmgw_dev.engine_proc import free_port
from llmgw_node.config import ConfiguredEngine, NodeConfig
from llmgw_node.service import open_node_service
from llmgw_node.supervisor import Timing
from llmgw_shared.tracing import TracingConfig
from llmgw_shared.wire import TRACE_CONTEXT, EngineSpec, ReplicaSpec, SetEngines, StartReplica
from support.otlp import http_receiver
from support.served_engines import VERSIONS, engines_config, model_directory

# Left out of the quick tier: a vLLM stand-in started as a process.
pytestmark = pytest.mark.slow

TRACE, SET_ENGINES, START = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "11f067aa0ba902b8"


async def test_an_engine_install_and_a_replica_start_are_spans(
    node_config: NodeConfig, tmp_path: Path, fast_timing: Timing
) -> None:
    engines = [ConfiguredEngine(**e) for e in engines_config(tmp_path / "bin")]  # type: ignore[arg-type]
    model_dir = str(model_directory(tmp_path / "models" / "qwen"))
    async with http_receiver() as receiver:
        config = attrs.evolve(
            node_config,
            engines=engines,
            model_roots=[str(tmp_path / "models")],
            tracing=TracingConfig(endpoint=receiver.url, service_name="node-under-test"),
        )
        async with open_node_service(config, timing=fast_timing) as svc:
            assert TRACE_CONTEXT in svc.hello().features  # control may send it a traceparent
            # A llama.cpp release from a source that is not there: the install fails, its span says so.
            nowhere = f"http://127.0.0.1:{free_port()}/releases/{{version}}"
            # Each command carries control's command span (the hello named trace_context).
            await svc.handle(
                SetEngines(
                    id="e",
                    fencing_token=1,
                    engines=[EngineSpec("vllm", VERSIONS["vllm"]), EngineSpec("llama.cpp", "b1", release_api=nowhere)],
                    traceparent=f"00-{TRACE}-{SET_ENGINES}-01",
                )
            )
            failed = await next_engine_state(svc, lambda e: e.name == "llama.cpp" and e.status == "failed")
            assert failed.status == "failed"
            spec = ReplicaSpec(
                replica_id="vllm-0",
                engine="vllm",
                engine_version=VERSIONS["vllm"],
                weights=None,
                port=free_port(),
                api_key="sk-replica-secret",
                args=["--served-model-name", "q"],
                env={},
                start_timeout_s=30.0,
                max_restarts=0,
                model_dir=model_dir,
            )
            assert (
                await svc.handle(
                    StartReplica(id="s", fencing_token=1, replica=spec, traceparent=f"00-{TRACE}-{START}-01")
                )
            ).ok
            ready = await next_replica_state(svc, "vllm-0", lambda s: s.status in ("ready", "failed"))
            assert ready.status == "ready", ready.describe()
            await svc.stop_engines()
        # Leaving the service flushed its spans.
        spans = receiver.spans
    (install,) = [s for s in spans if s.name == "llmgw.engine_install"]
    assert install.service == "node-under-test"
    assert install.attributes["llmgw.engine"] == "llama.cpp" and install.attributes["llmgw.engine_version"] == "b1"
    assert install.status_code == 2  # STATUS_CODE_ERROR: the install failed
    (start,) = [s for s in spans if s.name == "llmgw.replica_start"]
    assert start.attributes["llmgw.replica"] == "vllm-0" and start.attributes["llmgw.engine"] == "vllm"
    assert start.attributes["llmgw.port"] == spec.port
    # The node's spans continue control's trace: each is the child of the command that asked.
    assert (install.trace_id, install.parent_span_id) == (TRACE, SET_ENGINES)
    assert (start.trace_id, start.parent_span_id) == (TRACE, START)
    assert not any("sk-replica-secret" in str(v) for s in spans for v in s.attributes.values())
