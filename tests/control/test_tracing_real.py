"""A request to the real llama-server through the gateway, traced: the attempt that called the
engine, its outcome and the engine's own token counts on the request's span, exported by the
SDK's OTLP/HTTP exporter to a loopback receiver (tests/support/otlp.py)."""

from __future__ import annotations

import pytest

from llmgw_dev.engine_proc import LlamaServer
from llmgw_shared.tracing import TracingConfig
from support.gateway import endpoint, running_gateway
from support.otlp import http_receiver

pytestmark = pytest.mark.engine


async def test_the_engine_call_is_traced(real_engine: LlamaServer) -> None:
    async with http_receiver() as receiver:
        async with running_gateway(
            endpoint("chat", real_engine.url, "tiny"), tracing=TracingConfig(endpoint=receiver.url)
        ) as gw:
            prompt = "Say something about lighthouses"
            response = await gw.client.post(
                "/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 12},
            )
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
        # The gateway has stopped: its last flush is done.
        spans = receiver.spans
    (request,) = [s for s in spans if s.name == "llmgw.request"]
    (attempt,) = [s for s in spans if s.name == "llmgw.attempt"]
    assert attempt.parent_span_id == request.span_id and attempt.trace_id == request.trace_id
    assert attempt.attributes["llmgw.replica"] == "chat" and attempt.attributes["llmgw.outcome"] == "answered"
    assert request.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert request.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 12
    assert request.attributes["http.response.status_code"] == 200
    assert not any(prompt in str(v) for s in spans for v in s.attributes.values())
