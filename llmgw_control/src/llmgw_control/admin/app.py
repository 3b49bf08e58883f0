"""The admin listener's Quart app (loopback by default) and the metrics-only app."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from quart import Response, jsonify
from quart_trio import QuartTrio


def _metrics_response(registry: CollectorRegistry) -> Response:
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _json_errors(app: QuartTrio) -> None:
    @app.errorhandler(404)
    async def not_found(_: Any) -> tuple[Any, int]:
        return jsonify({"error": {"message": "Not found.", "code": "not_found"}}), 404

    @app.errorhandler(405)
    async def not_allowed(_: Any) -> tuple[Any, int]:
        return jsonify({"error": {"message": "Method not allowed.", "code": "method_not_allowed"}}), 405


def make_admin_app(registry: CollectorRegistry, fleet: Any = None) -> QuartTrio:
    app = QuartTrio("llmgw_control.admin")
    app.config["RESPONSE_TIMEOUT"] = None
    _json_errors(app)

    if fleet is not None:
        from .fleet_views import register_fleet_views

        register_fleet_views(app, fleet)

    @app.get("/metrics")
    async def metrics() -> Response:
        return _metrics_response(registry)

    @app.get("/healthz")
    async def healthz() -> Any:
        return jsonify({"status": "ok"})

    return app


def make_metrics_app(registry: CollectorRegistry) -> QuartTrio:
    app = QuartTrio("llmgw_control.metrics")
    _json_errors(app)

    @app.get("/metrics")
    async def metrics() -> Response:
        return _metrics_response(registry)

    return app
