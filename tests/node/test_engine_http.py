"""The engine HTTP helpers that need no engine: metrics parsing, URLs, port checks."""

from __future__ import annotations

import socket

import httpx2

from llmgw_dev.fake_engine import FakeEngineBehavior, run_fake_engine
from llmgw_node.engine_http import base_url, busy_from_metrics, healthy, in_flight, port_free

# Shaped like llama-server b11312's /metrics output.
METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


def test_busy_counts_processing_and_deferred() -> None:
    assert busy_from_metrics(METRICS) == 5
    assert busy_from_metrics(METRICS.replace(" 2\n", " 0\n").replace(" 3\n", " 0\n")) == 0


def test_base_url_reaches_a_wildcard_bind_on_loopback() -> None:
    assert base_url("0.0.0.0", 8001) == "http://127.0.0.1:8001"
    assert base_url("::", 8001) == "http://[::1]:8001"
    assert base_url("10.0.0.5", 8001) == "http://10.0.0.5:8001"


def test_port_free() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not port_free("127.0.0.1", sock.getsockname()[1])
    assert port_free("127.0.0.1", 0)


async def test_health_and_load_probes_survive_an_engine_closing_keep_alive_connections() -> None:
    # Issue 28: an engine closes pooled connections at random moments, some as a probe arrives;
    # a probe that met that race is sent again rather than counted as the engine's failure.
    behavior = FakeEngineBehavior(keepalive_close_rate=0.3, keepalive_close_seed=28)
    async with run_fake_engine(behavior) as engine, httpx2.AsyncClient() as client:
        host, port = engine.url.removeprefix("http://").rsplit(":", 1)
        results = [await healthy(client, host, int(port), limit_s=5) for _ in range(300)]
        loads = [await in_flight(client, host, int(port), "key") for _ in range(100)]
        assert engine.observed.keepalive_closes > 50
    assert results == [True] * 300
    assert None not in loads
