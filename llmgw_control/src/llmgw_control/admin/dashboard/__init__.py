"""The operator's dashboard: pages on the admin listener at ``/`` and on the client port at ``/admin``.

``open_dashboard`` builds what both mounts share; ``register_admin_dashboard`` adds the pages to
the admin listener's app; ``client_dashboard`` makes the client port's fallback app (login,
pages, and the admin API behind the session). See docs/dashboard.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quart import jsonify
from quart_trio import QuartTrio

from ...byte_ranges import StrictRangeResponse
from ...store import cluster_secret
from ..audit_log import AuditLog
from .client import PREFIX, ClientDashboard
from .context import Dashboard, Mount
from .revocations import SessionRevocations
from .session import SessionSigner
from .views import admin_origin_guard, make_blueprint

__all__ = ["Dashboard", "SessionRevocations", "client_dashboard", "open_dashboard", "register_admin_dashboard"]


async def open_dashboard(
    *,
    fleet: Any,
    tenancy: Any,
    prometheus: str,
    data_dir: Path,
    audit: AuditLog | None = None,
    sso: Any = None,
    revocations: SessionRevocations | None = None,
) -> Dashboard:
    """The shared parts. The session secret is a cluster secret in the store, so every control
    daemon on one database accepts the others' sessions (a failover does not log operators out);
    ``data_dir/dashboard-secret`` seeds it when present."""
    secret = await cluster_secret(tenancy.store, "dashboard-session", data_dir / "dashboard-secret")
    return Dashboard(
        fleet=fleet,
        tenancy=tenancy,
        prometheus=prometheus,
        signer=SessionSigner(secret),
        audit=audit,
        sso=sso,
        revocations=revocations,
    )


def register_admin_dashboard(app: QuartTrio, dash: Dashboard) -> None:
    """The pages at ``/`` on the admin listener, and the origin guard for its state-changing requests."""
    admin_origin_guard(app, dash.audit)
    app.register_blueprint(make_blueprint(dash, Mount(prefix="", api_base="/api/v1", login=False)))


def client_dashboard(dash: Dashboard, admin_app: Any = None, *, otherwise: Any = None) -> ClientDashboard:
    """The client port's fallback: ``/admin`` pages behind the login, ``/admin/api/v1/`` to ``admin_app``,
    anything else to ``otherwise`` (the gateway, so unknown paths keep its OpenAI-shaped 404)."""
    pages = QuartTrio("llmgw_control.dashboard")
    pages.response_class = StrictRangeResponse  # its static files answer Range requests
    pages.config["RESPONSE_TIMEOUT"] = None
    # The pages take a login form and a logout form, nothing larger; anyone can send these.
    pages.config["MAX_CONTENT_LENGTH"] = 64 * 1024

    @pages.errorhandler(404)
    async def not_found(_: Any) -> tuple[Any, int]:
        return jsonify({"error": {"message": "Not found.", "code": "not_found", "field": None}}), 404

    @pages.errorhandler(405)
    async def not_allowed(_: Any) -> tuple[Any, int]:
        return jsonify({"error": {"message": "Method not allowed.", "code": "method_not_allowed", "field": None}}), 405

    pages.register_blueprint(
        make_blueprint(dash, Mount(prefix=PREFIX, api_base=f"{PREFIX}/api/v1", login=True)), url_prefix=PREFIX
    )
    return ClientDashboard(dash, pages, admin_app, otherwise=otherwise)
