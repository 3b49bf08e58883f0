"""Per-replica series do not outlive their replica: /metrics stays bounded as replicas come and go."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from llmgw_control.gateway.metrics import GatewayMetrics


def exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_forgetting_a_replica_drops_every_series_labelled_with_it() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    for replica in ("m-cpu-1111aaaa-0000000000000001", "keep"):
        metrics.requests.labels("m:cpu", replica, "200").inc()
        metrics.requests.labels("m:cpu", replica, "502").inc()
        metrics.replica_in_flight.labels(replica).inc()
        metrics.retries.labels(replica, "other_replica").inc()
        metrics.cooldowns.labels(replica).inc()
    metrics.forget_replica("m-cpu-1111aaaa-0000000000000001")
    text = exposition(registry)
    assert "m-cpu-1111aaaa" not in text
    assert text.count('replica="keep"') == 5


def test_every_metric_labelled_by_replica_is_one_forget_replica_drops() -> None:
    """A new per-replica metric must be added to forget_replica, or its series grow forever."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    labelled = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase) and "replica" in m._labelnames]
    for metric in labelled:
        metric.labels(**{name: "gone" if name == "replica" else "x" for name in metric._labelnames})
    metrics.forget_replica("gone")
    assert 'replica="gone"' not in exposition(registry), [m._name for m in labelled]
