"""The two error shapes llmgw answers in, one class each: the client API's and the admin API's.

**The client API** (``ClientApiError``) answers in the OpenAI error shape. Clients (the official
SDKs, LangChain, curl scripts) parse ``{"error": {...}}`` and branch on ``type`` and ``code``;
anything else -- an HTML page, a bare string, a traceback -- breaks them in confusing ways. Every
error the gateway, the tenancy's admission and a standby produce for a client goes through here.

**The admin API** (``AdminApiError``) answers ``{"error": {"message", "code", "field"}}``, where
``field`` names the input at fault; the admin API's routes and the services behind them (the
catalog's ``ModelService``) raise it, and ``admin/api/core.py`` turns it into the answer.

The module sits below every package that raises either (the gateway, tenancy, the catalog, the
admin API, the transport's own 408 and 503), so none of them imports another's errors.
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


# Status -> Anthropic error type (docs.anthropic.com, "Errors"); the anthropic SDK maps the status
# itself to BadRequestError, AuthenticationError, PermissionDeniedError, NotFoundError,
# RateLimitError and InternalServerError.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


@attrs.frozen
class ClientApiError(Exception):
    """An error to send to a client of the OpenAI API as is."""

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

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's shape, for the Messages routes: the anthropic SDK (and Claude Code) read
        ``error.type``, and pick the exception class by the status, which is kept as it is."""
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(self.status, "api_error"), "message": self.message},
        }

    def in_shape(self, api: str) -> bytes:
        """The body in the shape of the API the request came in on (``openai`` or ``anthropic``)."""
        return json.dumps(self.anthropic_body() if api == "anthropic" else self.body()).encode()


def invalid_request(message: str, *, param: str | None = None, code: str | None = None) -> ClientApiError:
    return ClientApiError(400, message, code=code, param=param)


def standby(leader_address: str | None) -> ClientApiError:
    """What a client gets from a control daemon that is not (or no longer) the leader."""
    return ClientApiError(
        503,
        f"This llmgw control daemon is a standby; the leader is {leader_address or 'unknown'}. "
        "Send requests to the leader (a load balancer checking /healthz does).",
        code="standby",
        headers=(("retry-after", "1"),),
    )


def model_not_found(model: str, available: list[str], *, restricted: bool = False) -> ClientApiError:
    """404 for a model that does not exist, naming what does: for a key restricted to some models
    (``restricted``), ``available`` is only those, and nothing else is named."""
    known = ", ".join(available) if available else ("none for this key" if restricted else "none are configured")
    return ClientApiError(
        404,
        f"The model '{model}' does not exist. Available models: {known}.",
        code="model_not_found",
        param="model",
    )


def sse_error_event(error: ClientApiError, stream_format: str | None = None) -> bytes:
    """An error after the stream began: the status is gone, so it travels as a final event.

    Chat and completions streams carry it as a ``data:`` event in the OpenAI shape. A Messages
    stream carries Anthropic's ``event: error``; a Responses stream an ``event: error`` whose data
    has both the Responses fields (``code``, ``message``) and an ``error`` object, which is what
    the openai SDK raises on.
    """
    if stream_format == "anthropic":
        return b"event: error\ndata: " + error.in_shape("anthropic") + b"\n\n"
    if stream_format == "responses":
        inner = error.body()["error"]
        event = {"type": "error", "code": inner["code"], "message": error.message, "param": error.param, "error": inner}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    return b"data: " + error.encoded() + b"\n\n"


def openai_error_body(status: int, code: str, message: str) -> bytes:
    """The client listener's error shape, for the answers the connection makes itself (408, 503)."""
    return ClientApiError(status, message, code=code).encoded()


# --------------------------------------------------------------------------- the admin API's


class AdminApiError(Exception):
    """An admin API answer other than success; ``field`` names the input at fault (``profiles[0].context``)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


def bad_request(field: str | None, message: str, code: str = "invalid_request") -> AdminApiError:
    return AdminApiError(400, code, f"{field}: {message}" if field else message, field)


def not_found(kind: str, key: str, field: str | None = None) -> AdminApiError:
    return AdminApiError(404, "not_found", f"{kind} {key!r} not found", field)


def conflict(message: str, field: str | None = None, code: str = "conflict") -> AdminApiError:
    return AdminApiError(409, code, message, field)


def admin_error_json(code: str, message: str, field: str | None = None) -> bytes:
    """The admin API's one error shape."""
    return json.dumps({"error": {"message": message, "code": code, "field": field}}).encode()


def admin_error_body(status: int, code: str, message: str) -> bytes:
    """The admin shape for the answers the connection makes itself (408, 503) on every listener but the client's."""
    return admin_error_json(code, message)
