"""The agent listener's app: the nodes' WebSocket, and the files control serves to them."""

from __future__ import annotations

from typing import Any

from quart import Response, abort, jsonify, request, send_file, websocket
from quart_trio import QuartTrio

from ..onboarding import Onboarding, register_install_routes
from .agents import AgentService
from .files import FileServer
from .tls import Identities


class _QuartSocket:
    """The agent service's Socket over Quart's websocket proxy."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws

    async def receive(self) -> str | bytes:
        data: str | bytes = await self._ws.receive()
        return data

    async def send(self, data: str) -> None:
        await self._ws.send(data)

    async def close(self, code: int, reason: str = "") -> None:
        await self._ws.close(code, reason)


def make_agent_app(service: AgentService, files: FileServer | None, identities: Identities | None = None, *,
                   onboarding: Onboarding | None = None) -> QuartTrio:
    """``identities``: node ids proven by client certificates, when a TLS front relays to this app."""
    app = QuartTrio("llmgw_control.agents")
    app.config["RESPONSE_TIMEOUT"] = None
    # The node install script and each node release's wheels (onboarding), next to the files nodes fetch.
    register_install_routes(app, onboarding)

    def certified(scope: Any) -> str | None:
        client = scope.get("client")
        return identities.get(client[1]) if identities is not None and client else None

    if identities is not None and identities.mutual:
        @app.before_request
        async def require_certificate() -> None:
            # With mutual TLS the files are for enrolled nodes only, like the socket.
            if certified(request.scope) is None:
                abort(403)

    @app.websocket("/agent/v1")
    async def agent() -> None:
        await websocket.accept()
        peer = websocket.remote_addr or ""
        await service.serve(_QuartSocket(websocket), peer, certified_node_id=certified(websocket.scope),
                            certificate_required=identities is not None and identities.mutual)

    @app.get("/healthz")
    async def healthz() -> Any:
        return jsonify({"status": "ok", "nodes": len(service.sessions)})

    @app.get("/releases/<name>/<version>")
    async def release(name: str, version: str) -> Any:
        if files is None or name != "llama.cpp":
            abort(404)
        # An index the operator wrote and signed is served byte for byte, its signature beside
        # it at <index URL>.minisig (where nodes with release_signing_keys look for it).
        signature = version.endswith(".minisig")
        static = files.static_release(name, version.removesuffix(".minisig"))
        if static is not None:
            path = static[1] if signature else static[0]
            if path is None:
                abort(404)
            return await send_file(path, mimetype="text/plain" if signature else "application/json")
        if signature:
            abort(404)
        body = await files.release(version)
        if body is None:
            abort(404)
        return jsonify(body)

    @app.get("/files/<kind>/<name>")
    async def file(kind: str, name: str) -> Response:
        path = files.path(kind, name) if files is not None else None
        if path is None:
            abort(404)
        # conditional=True answers Range requests, so nodes resume interrupted downloads.
        response = await send_file(path, conditional=True, mimetype="application/octet-stream")
        response.timeout = None
        return response

    @app.errorhandler(404)
    async def not_found(_: Any) -> tuple[Any, int]:
        return jsonify({"error": {"message": "Not found.", "code": "not_found"}}), 404

    return app
