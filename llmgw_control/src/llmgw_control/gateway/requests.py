"""Reading and checking an OpenAI request body before it goes anywhere.

Engines are poor judges of bad input: llama-server answers invalid JSON with a 500 and reads a
65 MiB body for 22 s before refusing it. The gateway refuses such requests itself, early, with a
400 that names the field, so an engine's 5xx keeps meaning "the engine is unwell" -- which is what
the retry and cooldown logic relies on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs

from llmgw_shared.jsonin import loads

from ..api_errors import ClientApiError, invalid_request


class ClientGone(Exception):
    """The client disconnected before its request was complete."""


# Which API an endpoint belongs to: its error shape, and how its clients send their key.
Api = Literal["openai", "anthropic"]
# How an engine's streamed answer is framed: OpenAI's ``data:`` events ending in ``[DONE]``, or
# named ``event:`` lines (Anthropic Messages, OpenAI Responses), or llama.cpp's own ``data:``
# events without ``[DONE]`` (/infill).
StreamFormat = Literal["openai", "anthropic", "responses", "llama"]
# What a request's affinity id is made of (gateway/affinity.py): its opening messages, its
# prompt, or nothing (least loaded).
AffinityShape = Literal["messages", "prompt", "none"]


@attrs.frozen
class Field:
    """One top-level field of a request body and the JSON types it may hold."""

    name: str
    # string, array, object, objects (an array of objects), integer, number, boolean, and
    # alternatives joined with "|" ("string|objects")
    types: str
    required: bool = False
    # ``types`` split, once: this runs for every field of every request.
    kinds: tuple[str, ...] = attrs.field(init=False)

    @kinds.default
    def _split(self) -> tuple[str, ...]:
        return tuple(self.types.split("|"))


@attrs.frozen
class Endpoint:
    """One route of the client API: everything the gateway does differently per API is here."""

    path: str  # the engine's path the request is forwarded to
    kind: str  # chat | completions | embeddings | responses | messages | count_tokens | rerank | ...
    api: Api
    # The capability a model needs to serve it (gateway/capabilities.py).
    capability: str
    fields: tuple[Field, ...]
    # The stream's framing when ``stream: true`` is honoured; None: never streamed.
    stream_format: StreamFormat | None = None
    affinity: AffinityShape = "none"
    # Where the request names its output budget, for the quota's reservation; () generates none.
    max_output: tuple[str, ...] = ()
    # The field whose items are messages (each an object, with ``content`` a string or blocks).
    messages: str = ""
    # Whether the model runs: the tokenizer routes (tokenize, count_tokens...) cost no tokens of
    # any quota, and are counted as requests only.
    metered: bool = True

    @property
    def streams(self) -> bool:
        return self.stream_format is not None

    @property
    def required(self) -> str:
        """The field holding the input (the first required one), for messages and tests."""
        return next((f.name for f in self.fields if f.required), "")


_SAMPLING = (Field("temperature", "number"), Field("top_p", "number"), Field("stream", "boolean"))
_OPENAI_SAMPLING = (
    *_SAMPLING,
    Field("presence_penalty", "number"),
    Field("frequency_penalty", "number"),
    Field("max_tokens", "integer"),
    Field("max_completion_tokens", "integer"),
    Field("n", "integer"),
    Field("stream_options", "object"),
    Field("stop", "string|array"),
    Field("tools", "objects"),
)
_ANTHROPIC_BODY = (
    Field("messages", "objects", True),
    Field("system", "string|objects"),
    Field("tools", "objects"),
    Field("tool_choice", "object"),
    Field("metadata", "object"),
    Field("stop_sequences", "array"),
)

# The one dispatch table: every route the client listener serves by model. Adding an engine API
# is a row here, not a copy of the handler.
ENDPOINTS = {
    "/v1/chat/completions": Endpoint(
        "/v1/chat/completions",
        "chat",
        "openai",
        "chat",
        (Field("messages", "objects", True), *_OPENAI_SAMPLING),
        "openai",
        "messages",
        ("max_completion_tokens", "max_tokens"),
        "messages",
    ),
    "/v1/completions": Endpoint(
        "/v1/completions",
        "completions",
        "openai",
        "completions",
        (Field("prompt", "string|array", True), *_OPENAI_SAMPLING),
        "openai",
        "prompt",
        ("max_tokens",),
    ),
    "/v1/embeddings": Endpoint(
        "/v1/embeddings", "embeddings", "openai", "embeddings", (Field("input", "string|array", True),)
    ),
    "/v1/responses": Endpoint(
        "/v1/responses",
        "responses",
        "openai",
        "responses",
        (
            Field("input", "string|objects", True),
            Field("instructions", "string"),
            Field("tools", "objects"),
            Field("max_output_tokens", "integer"),
            Field("text", "object"),
            Field("reasoning", "object"),
            *_SAMPLING,
        ),
        "responses",
        "messages",
        ("max_output_tokens",),
        "input",
    ),
    "/v1/messages": Endpoint(
        "/v1/messages",
        "messages",
        "anthropic",
        "messages",
        (*_ANTHROPIC_BODY, Field("max_tokens", "integer"), Field("top_k", "integer"), *_SAMPLING),
        "anthropic",
        "messages",
        ("max_tokens",),
        "messages",
    ),
    "/v1/messages/count_tokens": Endpoint(
        "/v1/messages/count_tokens",
        "count_tokens",
        "anthropic",
        "messages",
        _ANTHROPIC_BODY,
        messages="messages",
        metered=False,
    ),
    "/v1/rerank": Endpoint(
        "/v1/rerank",
        "rerank",
        "openai",
        "rerank",
        (Field("query", "string", True), Field("documents", "array", True), Field("top_n", "integer")),
    ),
    "/tokenize": Endpoint(
        "/tokenize",
        "tokenize",
        "openai",
        "tokenize",
        (Field("content", "string|array", True), Field("add_special", "boolean"), Field("with_pieces", "boolean")),
        metered=False,
    ),
    "/detokenize": Endpoint(
        "/detokenize", "detokenize", "openai", "tokenize", (Field("tokens", "array", True),), metered=False
    ),
    "/apply-template": Endpoint(
        "/apply-template",
        "apply_template",
        "openai",
        "chat",
        (Field("messages", "objects", True),),
        messages="messages",
        metered=False,
    ),
    "/infill": Endpoint(
        "/infill",
        "infill",
        "openai",
        "infill",
        (
            Field("input_prefix", "string"),
            Field("input_suffix", "string"),
            Field("input_extra", "objects"),
            Field("prompt", "string"),
            Field("n_predict", "integer"),
            Field("max_tokens", "integer"),
            *_SAMPLING,
        ),
        "llama",
        "prompt",
        ("n_predict", "max_tokens"),
    ),
}
# Other names clients use for the same routes (Cohere/Jina-style rerank clients call /rerank).
ENDPOINTS["/rerank"] = ENDPOINTS["/v1/rerank"]


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
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


_KINDS: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "array": (list,),
    "objects": (list,),
    "object": (dict,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}
_LABELS = {
    "string": "a string",
    "array": "an array",
    "objects": "an array of objects",
    "object": "an object",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
}


def _fits(value: Any, kind: str) -> bool:
    # bool is an int in Python, but true is not a valid max_tokens.
    if isinstance(value, bool) and kind != "boolean":
        return False
    if not isinstance(value, _KINDS[kind]):
        return False
    return kind != "objects" or (isinstance(value, list) and all(isinstance(item, dict) for item in value))


def _check(payload: dict[str, Any], spec: Field) -> None:
    value = payload.get(spec.name)
    if value is None:
        if spec.required:
            raise invalid_request(
                f"Missing required parameter: '{spec.name}'.", param=spec.name, code="missing_required_parameter"
            )
        return
    kinds = spec.kinds
    # No generator for the common one-type field: this runs for every field of every request.
    if _fits(value, kinds[0]) if len(kinds) == 1 else any(_fits(value, kind) for kind in kinds):
        if kinds == ("integer",) and value < 0:
            raise invalid_request(
                f"Invalid '{spec.name}': must be 0 or greater, got {value}.", param=spec.name, code="invalid_value"
            )
        return
    label = " or ".join(_LABELS[kind] for kind in kinds)
    if isinstance(value, list) and "objects" in kinds:
        index = next(i for i, item in enumerate(value) if not isinstance(item, dict))
        raise invalid_request(
            f"Invalid type for '{spec.name}[{index}]': expected an object, but got {_type_name(value[index])} instead.",
            param=f"{spec.name}[{index}]",
            code="invalid_type",
        )
    raise invalid_request(
        f"Invalid type for '{spec.name}': expected {label}, but got {_type_name(value)} instead.",
        param=spec.name,
        code="invalid_type",
    )


_MODEL = Field("model", "string")


def _check_messages(payload: dict[str, Any], name: str) -> None:
    """Each message's ``content``: a string or an array of blocks (objects), in every API."""
    messages = payload[name]
    if not isinstance(messages, list):
        return  # a plain string input (Responses)
    if not messages:
        raise invalid_request(f"'{name}' must not be empty.", param=name, code="invalid_value")
    for index, message in enumerate(messages):
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
            raise invalid_request(
                f"Invalid type for '{name}[{index}].content': expected a string or an array of objects.",
                param=f"{name}[{index}].content",
                code="invalid_type",
            )


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
    _check(payload, _MODEL)
    for spec in endpoint.fields:
        _check(payload, spec)
    if endpoint.messages:
        _check_messages(payload, endpoint.messages)
    stream = bool(payload.get("stream")) and endpoint.streams
    return ParsedRequest(endpoint=endpoint, model=model, stream=stream, body=body, payload=payload)
