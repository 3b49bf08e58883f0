"""Reading and checking an OpenAI request body before it goes anywhere.

Engines are poor judges of bad input: llama-server answers invalid JSON with a 500 and reads a
65 MiB body for 22 s before refusing it. The gateway refuses such requests itself, early, with a
400 that names the field, so an engine's 5xx keeps meaning "the engine is unwell" -- which is what
the retry and cooldown logic relies on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from llmgw_shared.jsonin import loads

from ..api_errors import ClientApiError, invalid_request


class ClientGone(Exception):
    """The client disconnected before its request was complete."""


@attrs.frozen
class Endpoint:
    path: str
    kind: str  # chat | completions | embeddings
    required: str  # the field holding the input
    streams: bool


ENDPOINTS = {
    "/v1/chat/completions": Endpoint("/v1/chat/completions", "chat", "messages", True),
    "/v1/completions": Endpoint("/v1/completions", "completions", "prompt", True),
    "/v1/embeddings": Endpoint("/v1/embeddings", "embeddings", "input", False),
}


@attrs.frozen
class ParsedRequest:
    endpoint: Endpoint
    model: str
    stream: bool
    body: bytes
    payload: dict[str, Any]


async def read_body(
    receive: Callable[[], Awaitable[dict[str, Any]]], *, content_length: int | None, limit: int
) -> bytes:
    if content_length is not None and content_length > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _too_large(limit: int) -> ClientApiError:
    return ClientApiError(413, f"Request body is larger than the limit of {limit} bytes.", code="request_too_large")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def _expect(payload: dict[str, Any], name: str, kinds: tuple[type, ...], label: str) -> None:
    if name not in payload or payload[name] is None:
        return
    value = payload[name]
    # bool is an int in Python, but true is not a valid max_tokens.
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        raise invalid_request(
            f"Invalid type for '{name}': expected {label}, but got {_type_name(value)} instead.",
            param=name, code="invalid_type",
        )


def _non_negative_int(payload: dict[str, Any], name: str) -> None:
    _expect(payload, name, (int,), "an integer")
    value = payload.get(name)
    if isinstance(value, int) and value < 0:
        raise invalid_request(f"Invalid '{name}': must be 0 or greater, got {value}.", param=name,
                              code="invalid_value")


def parse_request(endpoint: Endpoint, body: bytes) -> ParsedRequest:
    if not body.strip():
        raise invalid_request("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        # Depth-bounded (llmgw_shared.jsonin): the body is re-encoded for the engine, and a value
        # nested near Python's recursion limit would fail there, as a 500.
        payload = loads(body)
    except ValueError as exc:
        detail = str(exc).splitlines()[0][:120]
        raise invalid_request(f"The request body is not valid JSON: {detail}", code="invalid_json") from None
    if not isinstance(payload, dict):
        raise invalid_request(
            f"The request body must be a JSON object, not {_type_name(payload)}.", code="invalid_json"
        )
    model = payload.get("model")
    if model is None or model == "":
        raise invalid_request("You must provide a model parameter.", param="model", code="missing_model")
    _expect(payload, "model", (str,), "a string")
    if endpoint.required not in payload or payload[endpoint.required] is None:
        raise invalid_request(
            f"Missing required parameter: '{endpoint.required}'.", param=endpoint.required,
            code="missing_required_parameter",
        )
    if endpoint.kind == "chat":
        _expect(payload, "messages", (list,), "an array")
        if not payload["messages"]:
            raise invalid_request("'messages' must not be empty.", param="messages", code="invalid_value")
        for index, message in enumerate(payload["messages"]):
            if not isinstance(message, dict):
                raise invalid_request(
                    f"Invalid type for 'messages[{index}]': expected an object, but got "
                    f"{_type_name(message)} instead.", param=f"messages[{index}]", code="invalid_type",
                )
    else:
        _expect(payload, endpoint.required, (str, list), "a string or an array")
    for name in ("max_tokens", "max_completion_tokens", "n"):
        _non_negative_int(payload, name)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        _expect(payload, name, (int, float), "a number")
    _expect(payload, "stream", (bool,), "a boolean")
    _expect(payload, "stream_options", (dict,), "an object")
    _expect(payload, "stop", (str, list), "a string or an array")
    stream = bool(payload.get("stream")) and endpoint.streams
    return ParsedRequest(endpoint=endpoint, model=model, stream=stream, body=body, payload=payload)
