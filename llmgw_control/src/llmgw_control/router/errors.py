"""The OpenAI error shape, in one place.

Clients (the official SDKs, LangChain, curl scripts) parse ``{"error": {...}}`` and branch on
``type`` and ``code``; anything else -- an HTML page, a bare string, a traceback -- breaks them
in confusing ways. Every error the gateway itself produces goes through here.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

# Status -> OpenAI error type, as the official API uses them.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


@attrs.frozen
class ApiError(Exception):
    """An error to send to the client as is."""

    status: int
    message: str
    code: str | None = None
    param: str | None = None
    type: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type or _TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def encoded(self) -> bytes:
        return json.dumps(self.body()).encode()


def invalid_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, code=code, param=param)


def standby(leader_address: str | None) -> ApiError:
    """What a client gets from a control daemon that is not (or no longer) the leader."""
    return ApiError(503, f"This llmgw control daemon is a standby; the leader is {leader_address or 'unknown'}. "
                         "Send requests to the leader (a load balancer checking /healthz does).",
                    code="standby", headers=(("retry-after", "1"),))


def model_not_found(model: str, available: list[str], *, restricted: bool = False) -> ApiError:
    """404 for a model that does not exist, naming what does: for a key restricted to some models
    (``restricted``), ``available`` is only those, and nothing else is named."""
    known = ", ".join(available) if available else ("none for this key" if restricted else "none are configured")
    return ApiError(
        404,
        f"The model '{model}' does not exist. Available models: {known}.",
        code="model_not_found",
        param="model",
    )


def sse_error_event(error: ApiError) -> bytes:
    """An error after the stream began: the status is gone, so it travels as a final event."""
    return b"data: " + error.encoded() + b"\n\n"
