"""Charts over time, read from Prometheus's ``query_range`` API and handed to the browser.

The browser names a chart and a time range; the queries themselves are fixed here, so the
dashboard cannot be used to run arbitrary PromQL against the operator's Prometheus, and the
browser never talks to Prometheus (which is often on a network only control can reach).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import httpx2
import trio

from llmgw_shared.jsonin import loads as json_loads
from llmgw_shared.logs import get_logger

log = get_logger(__name__)


@attrs.frozen
class Chart:
    id: str
    title: str
    unit: str
    # PromQL with ``{w}`` for the rate window.
    query: str
    legend: str


# ``model!=""``: requests that named no model (health checks, unknown names) are counted with an
# empty model label; they are not a model's traffic.
CHARTS: tuple[Chart, ...] = (
    Chart(
        "requests",
        "Requests per second",
        "req/s",
        'sum by (model) (rate(llmgw_requests_total{{model!=""}}[{w}]))',
        "model",
    ),
    Chart(
        "tokens",
        "Generated tokens per second",
        "tok/s",
        'sum by (model) (rate(llmgw_tokens_total{{kind="completion"}}[{w}]))',
        "model",
    ),
    Chart(
        "latency",
        "Request duration, p95",
        "s",
        'histogram_quantile(0.95, sum by (le, model) (rate(llmgw_request_duration_seconds_bucket{{model!=""}}[{w}])))',
        "model",
    ),
    Chart(
        "ttft",
        "Time to first token, p95",
        "s",
        "histogram_quantile(0.95, sum by (le, model) "
        '(rate(llmgw_time_to_first_token_seconds_bucket{{model!=""}}[{w}])))',
        "model",
    ),
    Chart("replicas", "Replicas by state", "", "sum by (state) (llmgw_fleet_replicas) > 0", "state"),
    Chart("queue", "Requests held waiting for a replica", "", "sum by (model) (llmgw_fleet_waiting_requests)", "model"),
)
CHARTS_BY_ID = {c.id: c for c in CHARTS}
# The ranges the page offers, in seconds; anything else is refused.
RANGES = (300, 900, 3600, 6 * 3600, 24 * 3600, 7 * 24 * 3600)
# Points per series: enough for a smooth line in a ~600 px chart, few enough to stay small.
POINTS = 120


class HistoryError(Exception):
    """Prometheus could not answer; the message is safe to show to the operator."""


def window(range_s: int) -> tuple[int, str]:
    """The query step and the rate window for a range: at least four scrapes per window."""
    step = max(5, math.ceil(range_s / POINTS))
    return step, f"{max(60, 4 * step)}s"


async def query_chart(
    client: httpx2.AsyncClient, prometheus: str, chart: Chart, range_s: int, *, now: float
) -> dict[str, Any]:
    step, rate_window = window(range_s)
    params = {
        "query": chart.query.format(w=rate_window),
        "start": f"{now - range_s:.0f}",
        "end": f"{now:.0f}",
        "step": str(step),
    }
    try:
        with trio.fail_after(10):
            response = await client.get(f"{prometheus}/api/v1/query_range", params=params)
    except (httpx2.HTTPError, trio.TooSlowError) as exc:
        log.warning("cannot reach Prometheus at %s: %s", prometheus, exc)
        raise HistoryError(f"Prometheus at {prometheus} did not answer ({type(exc).__name__}).") from None
    try:
        body = json_loads(response.content)
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("status") != "success":
        reason = body.get("error", "") if isinstance(body, dict) else response.text[:200]
        raise HistoryError(f"Prometheus answered {response.status_code}: {reason}")
    series = []
    for item in body.get("data", {}).get("result", []):
        label = (
            item.get("metric", {}).get(chart.legend)
            or ", ".join(f"{k}={v}" for k, v in sorted(item.get("metric", {}).items()))
            or chart.title
        )
        points = []
        for t, v in item.get("values", []):
            value = float(v)
            # NaN (a quantile over no requests) is a gap, not a zero.
            points.append([float(t), None if math.isnan(value) or math.isinf(value) else value])
        series.append({"label": label, "points": points})
    return {
        "id": chart.id,
        "title": chart.title,
        "unit": chart.unit,
        "start": now - range_s,
        "end": now,
        "step": step,
        "series": series,
    }
