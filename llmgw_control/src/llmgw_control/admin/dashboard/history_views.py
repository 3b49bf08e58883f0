"""``GET /dashboard/history.json``: the History page's charts, queried from Prometheus (history.py) on its behalf."""

from __future__ import annotations

import time
from typing import Any

import httpx2
from quart import Blueprint, jsonify, request

from .context import Dashboard, json_error
from .history import CHARTS_BY_ID, RANGES, HistoryError, query_chart


def add_history_view(bp: Blueprint, dash: Dashboard) -> None:
    @bp.get("/dashboard/history.json")
    async def history() -> Any:
        if not dash.prometheus:
            return json_error(
                404, "History is off: set [monitoring] prometheus in the control config.", "history_disabled"
            )
        chart = CHARTS_BY_ID.get(request.args.get("chart", ""))
        if chart is None:
            return json_error(400, f"chart must be one of {', '.join(CHARTS_BY_ID)}.", "invalid_chart", "chart")
        try:
            range_s = int(request.args.get("range", "3600"))
        except ValueError:
            range_s = -1
        if range_s not in RANGES:
            return json_error(
                400, f"range must be one of {', '.join(map(str, RANGES))} seconds.", "invalid_range", "range"
            )
        try:
            async with httpx2.AsyncClient(timeout=10) as client:
                return jsonify(await query_chart(client, dash.prometheus, chart, range_s, now=time.time()))
        except HistoryError as exc:
            return json_error(502, str(exc), "prometheus_unavailable")
