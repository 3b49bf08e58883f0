"""``GET /api/v1/traffic``: this daemon's live traffic, the last 15 minutes per model and replica
(``gateway/live.py``), for the dashboard's Models page without a Prometheus server."""

from __future__ import annotations

from ...api_errors import AdminApiError
from ...gateway.live import LiveTraffic, LiveWindow
from .core import Api, Call, Param


def add_traffic_routes(api: Api, live: LiveWindow | None) -> None:
    @api.route(
        "GET",
        "/traffic",
        summary="Live traffic seen by this daemon: the last 15 minutes in 10 s buckets",
        tag="traffic",
        response=LiveTraffic,
        errors=(503,),
        query=(Param("model", doc="Only this model key and its replicas"),),
    )
    async def traffic(call: Call) -> LiveTraffic:
        if live is None:
            raise AdminApiError(503, "not_ready", "live traffic is not kept on this daemon")
        return live.read(call.query.get("model"))
