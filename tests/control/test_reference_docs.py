"""The reference pages name everything the code exports, so they cannot fall behind silently."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from llmgw_control.fleet.metrics import NODE_STATES
from llmgw_control.gateway.metrics import GatewayMetrics
from llmgw_shared.wire import TAGS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_metrics_md_lists_every_series_control_exports() -> None:
    text = (DOCS / "metrics.md").read_text()
    registry = CollectorRegistry()
    GatewayMetrics(registry)
    names = {metric.name for metric in registry.collect()}
    # The fleet collector builds its families at scrape time: read their names from its source.
    source = (Path(__file__).resolve().parents[2] / "llmgw_control/src/llmgw_control/fleet/metrics.py").read_text()
    names |= set(re.findall(r'MetricFamily\(\s*"(llmgw_[a-z_]+)"', source))
    assert len(names) > 15
    missing = sorted(n for n in names if f"`{n}" not in text)
    assert missing == []
    for state in NODE_STATES:
        assert f"`{state}`" in text


def test_wire_protocol_md_describes_every_message_type() -> None:
    text = (DOCS / "wire-protocol.md").read_text()
    missing = sorted(tag for tag in TAGS.values() if f"`{tag}`" not in text and f'"type":"{tag}"' not in text)
    assert missing == []
