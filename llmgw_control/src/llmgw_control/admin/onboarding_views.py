"""``POST /api/v1/nodes`` on the admin listener: register a node and answer its install command.

Body ``{"name": "gpu-3", "labels": {"zone": "a"}}`` → 201 ``{"node_id", "join_token",
"install_command"}``; the token is in this answer and nowhere else (the store keeps its digest).
``POST /api/v1/nodes/{node_id}/token`` replaces a lost or leaked token the same way.
Declared on the admin API's route table (``app.extensions["llmgw.api"]``), so it is validated,
answers errors in the API's shape and appears in ``/api/v1/openapi.json`` like every other
route: 400 naming the field, 409 when the name is taken or onboarding cannot work as configured
(no wheels to serve, no address nodes can reach), 503 when the store is unavailable.
"""

from __future__ import annotations

from typing import Any

import attrs
from quart_trio import QuartTrio

from llmgw_shared.names import NODE_ID, NODE_ID_RULE

from ..api_errors import AdminApiError, conflict
from ..fleet.onboarding import Onboarding, OnboardingError
from .api.core import Api, Call

_LABEL = {"minLength": 1, "maxLength": 200}


@attrs.frozen
class AddNode:
    name: str = attrs.field(
        metadata={
            "schema": {"pattern": f"^{NODE_ID.pattern}$", "maxLength": 63, "x-pattern-message": f"use {NODE_ID_RULE}"},
            "doc": "The node id: how the node is named in the fleet (and in its config).",
        }
    )
    labels: dict[str, str] = attrs.field(
        factory=dict,
        metadata={
            "schema": {"maxProperties": 64, "propertyNames": _LABEL, "additionalProperties": {"maxLength": 200}},
            "doc": "Labels profiles can require (``labels`` in a model profile).",
        },
    )


@attrs.frozen
class AddedNode:
    node_id: str
    # Shown once: only its digest is stored.
    join_token: str = attrs.field(repr=False, metadata={"doc": "Shown once; control keeps only its digest."})
    install_command: str = attrs.field(
        repr=False,
        metadata={"doc": "Run as root on the node: installs llmgw-node from this control daemon and starts it."},
    )


def register_onboarding_views(app: QuartTrio, fleet: Any) -> None:
    """Serve POST /api/v1/nodes when the fleet has onboarding (an agent listener and a store)."""
    onboarding: Onboarding | None = getattr(fleet, "onboarding", None)
    api: Api | None = app.extensions.get("llmgw.api")
    if onboarding is None or api is None:
        return

    @api.route(
        "POST",
        "/nodes",
        summary="Register a node: a join token (shown once) and its install command",
        tag="nodes",
        body=AddNode,
        response=AddedNode,
        status=201,
        errors=(409, 503),
    )
    async def add_node(call: Call) -> AddedNode:
        body: AddNode = call.body
        try:
            created = await onboarding.create(body.name, body.labels)
        except ValueError as exc:
            raise AdminApiError(400, "invalid_request", str(exc), "name") from None
        except OnboardingError as exc:
            raise conflict(str(exc), code="onboarding_unavailable") from None
        return AddedNode(created.node_id, created.join_token, created.install_command)

    @api.route(
        "POST",
        "/nodes/{node_id}/token",
        summary="Replace an onboarded node's join token (shown once)",
        tag="nodes",
        response=AddedNode,
        errors=(404, 409, 503),
    )
    async def new_token(call: Call) -> AddedNode:
        try:
            created = await onboarding.new_token(call.path["node_id"])
        except OnboardingError as exc:
            raise conflict(str(exc), code="onboarding_unavailable") from None
        return AddedNode(created.node_id, created.join_token, created.install_command)

    api.install(app)
