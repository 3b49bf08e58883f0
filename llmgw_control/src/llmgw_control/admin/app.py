"""The admin listener's Quart app (loopback by default) and the metrics-only app."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from quart import Response, jsonify
from quart_trio import QuartTrio

from ..byte_ranges import StrictRangeResponse
from ..catalog.service import ModelService
from ..mirror.service import Mirror
from .api import ApiContext, build_api
from .api.audit_routes import add_audit_routes
from .api.capacity_routes import add_capacity_routes
from .api.core import error_body
from .api.mirror_routes import add_mirror_routes
from .api.session_routes import add_session_routes
from .api.traffic_routes import add_traffic_routes
from .audit_log import AuditLog
from .debug_views import register_debug_views
from .onboarding_views import register_onboarding_views
from .standby_refusal import LEADER_HEADER, standby_leader

if TYPE_CHECKING:
    from ..fleet.fleet import Fleet
    from ..gateway.live import LiveWindow
    from ..tenancy.tenancy import Tenancy
    from .dashboard.revocations import SessionRevocations


def _metrics_response(registry: CollectorRegistry) -> Response:
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _json_errors(app: QuartTrio) -> None:
    """The admin API's one error shape for what Quart itself refuses (no route, wrong method...)."""

    @app.errorhandler(404)
    async def not_found(_: Any) -> Response:
        return error_body(404, "not_found", "Not found.")

    @app.errorhandler(405)
    async def not_allowed(_: Any) -> Response:
        return error_body(405, "method_not_allowed", "Method not allowed.")

    @app.errorhandler(413)
    async def too_large(_: Any) -> Response:
        return error_body(413, "body_too_large", "The body is too large.")


def make_admin_app(
    registry: CollectorRegistry,
    fleet: Fleet | None = None,
    *,
    tenancy: Tenancy | None = None,
    models: ModelService | None = None,
    mirror: Mirror | None = None,
    audit: AuditLog | None = None,
    live: LiveWindow | None = None,
    sessions: SessionRevocations | None = None,
) -> QuartTrio:
    app = QuartTrio("llmgw_control.admin")
    # Its files (the dashboard's static ones) answer Range requests through our strict parser.
    app.response_class = StrictRangeResponse
    app.config["RESPONSE_TIMEOUT"] = None
    # Admin bodies are small (a model definition is the largest); refuse more before reading it.
    app.config["MAX_CONTENT_LENGTH"] = 1024 * 1024
    _json_errors(app)

    api = build_api(ApiContext(fleet=fleet, tenancy=tenancy, models=models))
    api.audit = audit
    add_audit_routes(api, tenancy.store if tenancy is not None else None)
    add_mirror_routes(api, mirror, fleet)
    add_capacity_routes(api, fleet.capacity if fleet is not None else None, fleet)
    add_traffic_routes(api, live)
    add_session_routes(api, sessions)
    api.install(app)
    # Other modules add their routes to the same table (``api.route(...)`` then ``api.install(app)``),
    # so they are served with the same validation and error shape and appear in the document.
    app.extensions["llmgw.api"] = api
    register_onboarding_views(app, fleet)
    register_debug_views(app)

    @app.after_request
    async def name_the_leader(response: Response) -> Response:
        # Every admin answer of a standby says so: fleet reads come from the leader's view in the
        # store, and a caller (ctl, the dashboard, a script) can tell, and find the leader.
        standby, leader = standby_leader(fleet)
        if standby:
            response.headers.setdefault(LEADER_HEADER, leader or "unknown")
        return response

    @app.get("/api/v1/openapi.json")
    async def openapi() -> Any:
        return jsonify(api.openapi("llmgw admin API", "1"))

    @app.get("/metrics")
    async def metrics() -> Response:
        return _metrics_response(registry)

    @app.get("/healthz")
    async def healthz() -> Any:
        return jsonify({"status": "ok"})

    return app


def make_metrics_app(registry: CollectorRegistry) -> QuartTrio:
    app = QuartTrio("llmgw_control.metrics")
    app.response_class = StrictRangeResponse
    _json_errors(app)

    @app.get("/metrics")
    async def metrics() -> Response:
        return _metrics_response(registry)

    return app
