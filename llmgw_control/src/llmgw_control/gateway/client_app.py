"""The client listener's ASGI entry: the model APIs' paths go to the gateway, the rest to Quart."""

from __future__ import annotations

from typing import Any

from ..transport.asgi import Receive, Scope, Send, serve_lifespan
from .gateway import Gateway
from .requests import ENDPOINTS


class ClientApp:
    def __init__(self, gateway: Gateway, fallback: Any = None) -> None:
        self.gateway = gateway
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path: str = scope["path"]
            # The engine routes outside /v1 (/tokenize, /infill, /rerank...) are the gateway's too.
            if self.fallback is None or path.startswith("/v1/") or path in ("/v1", "/healthz") or path in ENDPOINTS:
                await self.gateway(scope, receive, send)
            else:
                await self.fallback(scope, receive, send)
        elif kind == "lifespan":
            await serve_lifespan(receive, send)
        elif self.fallback is not None:
            await self.fallback(scope, receive, send)
        else:
            await send({"type": "websocket.close", "code": 1008})
