"""examples/prometheus: the alert rules parse and their own unit tests pass (promtool, Debian's prometheus)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is missing: apt-get install -y prometheus")
    return subprocess.run([tool, *args], cwd=EXAMPLES, capture_output=True, text=True, timeout=60, check=False)


def test_the_alert_rules_parse() -> None:
    result = promtool("check", "rules", "llmgw-alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alert_rules_fire_as_their_tests_say() -> None:
    result = promtool("test", "rules", "llmgw-alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_scrape_config_is_valid() -> None:
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_chart_queries_are_valid_promql(tmp_path: Path) -> None:
    from llmgw_control.admin.dashboard.history import CHARTS, RANGES, window

    # As recording rules, so promtool parses each query exactly as Prometheus will.
    rules = ["groups:", "  - name: dashboard", "    rules:"]
    for chart in CHARTS:
        for range_s in (RANGES[0], RANGES[-1]):
            query = chart.query.format(w=window(range_s)[1]).replace("'", "''")
            rules += [f"      - record: dashboard:{chart.id}:{range_s}", f"        expr: '{query}'"]
    (tmp_path / "charts.yml").write_text("\n".join(rules) + "\n")
    result = promtool("check", "rules", str(tmp_path / "charts.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
