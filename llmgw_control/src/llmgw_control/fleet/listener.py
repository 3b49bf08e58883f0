"""The agent listener's app: the nodes' WebSocket, and the files control serves to them.

The files (engine archives and their release index, model weights, llmgw-node's wheels) are for
enrolled nodes only: a request must carry the credentials the node joins with, as HTTP Basic
``<node id>:<join token>`` (llmgw-node and the install script send them), checked exactly as a
hello's are (``AgentService.enrolled``); under mutual TLS the client certificate is the proof
instead. The install script itself is open: a machine that is not a node yet fetches it, and
the command that runs it pins its sha256. ``/healthz`` is open too.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from quart import Response, abort, jsonify, request, send_file, websocket
from quart_trio import QuartTrio

from ..byte_ranges import StrictRangeResponse
from .agents import AgentService
from .files import FileServer
from .onboarding import Onboarding, register_install_routes
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


# The routes anyone may use; every other route of this app is for enrolled nodes. Decided by the
# route matched, not by the path's spelling, so no other spelling of a path can slip past.
OPEN_ENDPOINTS = frozenset({"healthz", "install_script"})
# A Basic credential longer than this is no node's (a node id is at most 63 characters, a token
# from `ctl nodes add` 54): it is refused before it is decoded.
_MAX_CREDENTIALS = 1024


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """``(user, password)`` from an ``Authorization: Basic`` header, or None when there is none or it is malformed."""
    if header is None or len(header) > _MAX_CREDENTIALS:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        text = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    user, colon, password = text.partition(":")
    return (user, password) if colon else None


def _not_enrolled() -> Response:
    body = json.dumps(
        {
            "error": {
                "message": "Only enrolled nodes may fetch this: send the node id and its join token as HTTP Basic "
                "credentials (llmgw-node does), or a client certificate under mutual TLS.",
                "code": "node_credentials_required",
                "field": None,
            }
        }
    )
    return Response(
        body,
        status=401,
        content_type="application/json",
        headers={"WWW-Authenticate": 'Basic realm="llmgw nodes", charset="UTF-8"'},
    )


def make_agent_app(
    service: AgentService,
    files: FileServer | None,
    identities: Identities | None = None,
    *,
    onboarding: Onboarding | None = None,
) -> QuartTrio:
    """``identities``: node ids proven by client certificates, when a TLS front relays to this app."""
    app = QuartTrio("llmgw_control.agents")
    # Range requests (nodes resume downloads) are parsed by byte_ranges, strictly (RFC 9110).
    app.response_class = StrictRangeResponse
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
    else:

        @app.before_request
        async def require_node_credentials() -> Response | None:
            if request.endpoint is None or request.endpoint in OPEN_ENDPOINTS:
                return None  # open, or no such route (a 404 says nothing)
            credentials = basic_credentials(request.headers.get("Authorization"))
            if credentials is not None and await service.enrolled(*credentials):
                return None
            return _not_enrolled()

    @app.websocket("/agent/v1")
    async def agent() -> None:
        await websocket.accept()
        peer = websocket.remote_addr or ""
        await service.serve(
            _QuartSocket(websocket),
            peer,
            certified_node_id=certified(websocket.scope),
            certificate_required=identities is not None and identities.mutual,
        )

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
