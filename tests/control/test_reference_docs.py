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


# Both sides send these: each keeps the other's session alive, and either names a bad frame.
_BOTH_WAYS = {"heartbeat", "error"}


def _wire_table(text: str) -> dict[str, tuple[str, str]]:
    """docs/node.md's message table: tag -> (class, direction)."""
    start = text.index("| type | class | fields | direction |")
    rows: dict[str, tuple[str, str]] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        tag, cls, direction = cells[0].strip("`"), cells[1].strip("`"), cells[-1]
        assert tag not in rows, f"{tag} listed twice"
        rows[tag] = (cls, direction)
    return rows


def test_node_md_wire_table_lists_every_message_with_its_class_and_direction() -> None:
    from llmgw_shared import wire

    rows = _wire_table((DOCS / "node.md").read_text())
    assert sorted(rows) == sorted(TAGS.values())
    from_nodes = {TAGS[cls] for cls in wire._FROM_NODES}
    for cls, tag in TAGS.items():
        documented_class, direction = rows[tag]
        assert documented_class == cls.__name__, tag
        expected = "both" if tag in _BOTH_WAYS else "node → control" if tag in from_nodes else "control → node"
        assert direction.startswith(expected), f"{tag}: {direction!r}, the code says {expected}"
