"""The admin REST API (``/api/v1``): one module per resource, composed here in one table.

Each ``add_*_routes`` declares its resource's routes on the table. The order below is the order
of the OpenAPI document's paths and of the endpoints' names, so a new resource is one more line at
the end. The app adds the routes of the parts it owns (audit, mirror, capacity runs, traffic).
"""

from __future__ import annotations

from .adapter_routes import add_adapter_routes
from .context import ApiContext
from .core import Api
from .engine_routes import add_engine_routes
from .group_routes import add_group_routes
from .key_routes import add_key_routes
from .model_routes import add_model_routes
from .node_routes import add_node_routes
from .quota_routes import add_quota_routes
from .replica_routes import add_replica_routes
from .usage_routes import add_usage_routes

__all__ = ["ApiContext", "build_api"]


def build_api(ctx: ApiContext) -> Api:
    api = Api()
    add_node_routes(api, ctx)
    add_model_routes(api, ctx)
    add_replica_routes(api, ctx)
    add_engine_routes(api, ctx)
    add_group_routes(api, ctx)
    add_key_routes(api, ctx)
    add_quota_routes(api, ctx)
    add_usage_routes(api, ctx)
    add_adapter_routes(api, ctx)
    return api
