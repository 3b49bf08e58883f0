"""The admin API's OpenAPI 3.1 document, generated from the route table and its attrs classes.

Every route's body, query and answer are attrs classes (``core.Route``); their JSON Schema is
written from the classes and the fields' ``schema`` metadata, the same constraints
``validate.py`` checks, so the document cannot drift from what the server does.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

import attrs

from .validate import MAX_INT

if TYPE_CHECKING:
    from .core import Route

# A path parameter in a route's path (``/nodes/{node_id}``).
PATH_PARAM = re.compile(r"\{([a-z_]+)\}")


def _is_attrs(tp: Any) -> bool:
    return isinstance(tp, type) and attrs.has(tp)


class SchemaBuilder:
    """JSON Schema (OpenAPI 3.1 dialect) for the types the API's attrs classes use."""

    def __init__(self) -> None:
        self.components: dict[str, Any] = {}

    def of(self, tp: Any) -> dict[str, Any]:
        origin, args = get_origin(tp), get_args(tp)
        if tp is Any:
            return {}
        if tp is type(None):
            return {"type": "null"}
        if tp is str:
            return {"type": "string"}
        if tp is bool:
            return {"type": "boolean"}
        if tp is int:
            return {"type": "integer", "minimum": -MAX_INT, "maximum": MAX_INT}
        if tp is float:
            return {"type": "number"}
        if tp is datetime:
            return {"type": "string", "format": "date-time"}
        if origin is Literal:
            return {"enum": list(args)}
        if origin in (Union, types.UnionType):
            return {"anyOf": [self.of(a) for a in args]}
        if origin in (list, tuple) or origin is typing.Sequence:
            return {"type": "array", "items": self.of(args[0])}
        if origin in (dict, Mapping) or origin is typing.Mapping:
            return {"type": "object", "additionalProperties": self.of(args[1])}
        if _is_attrs(tp):
            return self._ref(tp)
        raise TypeError(f"no JSON schema for {tp!r}")

    def _ref(self, cls: type) -> dict[str, Any]:
        name = cls.__name__
        if name not in self.components:
            self.components[name] = {}  # placeholder: a class may refer to itself
            hints = typing.get_type_hints(cls)
            properties: dict[str, Any] = {}
            required: list[str] = []
            for field in attrs.fields(cls):
                schema = self.of(hints[field.name])
                extra = {k: v for k, v in field.metadata.get("schema", {}).items() if not k.startswith("x-")}
                if extra:
                    schema = _merge(schema, extra)
                if field.metadata.get("doc"):
                    schema = {**schema, "description": field.metadata["doc"]}
                properties[field.name] = schema
                if field.default is attrs.NOTHING:
                    required.append(field.name)
            component: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
            if required:
                component["required"] = required
            if cls.__doc__:
                component["description"] = " ".join(cls.__doc__.split())
            self.components[name] = component
        return {"$ref": f"#/components/schemas/{name}"}


def _merge(schema: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Constraints of a field applied to its schema, inside an ``anyOf`` with null if optional."""
    if "anyOf" in schema:
        return {"anyOf": [s if s.get("type") == "null" else _merge(s, extra) for s in schema["anyOf"]]}
    merged = {**schema, **extra}
    if "items" in extra and "items" in schema:
        merged["items"] = {**schema["items"], **extra["items"]}
    if "additionalProperties" in extra and isinstance(schema.get("additionalProperties"), dict):
        merged["additionalProperties"] = {**schema["additionalProperties"], **extra["additionalProperties"]}
    return merged


_ERROR_WORDS = {
    400: "Bad input; `field` names it.",
    404: "The object addressed does not exist.",
    409: "The change contradicts what exists (a duplicate, an object in use, a model from the config file).",
    413: "The body is larger than 1 MiB.",
    502: "An upstream service (the Hugging Face Hub) answered an error or could not be reached.",
    503: "The store is unavailable, or this daemon is not ready.",
    504: "An upstream service (the Hugging Face Hub) did not answer in time.",
}


@attrs.frozen
class ErrorDetail:
    message: str
    code: str
    field: str | None


@attrs.frozen
class ErrorBody:
    """Every error the admin API answers."""

    error: ErrorDetail


def openapi_document(routes: Sequence[Route], title: str, version: str) -> dict[str, Any]:
    """The document describing ``routes``."""
    builder = SchemaBuilder()
    builder.of(ErrorBody)
    paths: dict[str, Any] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "operationId": route.handler.__name__,
            "summary": route.summary,
            "tags": [route.tag],
        }
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
            for name in PATH_PARAM.findall(route.path)
        ]
        for param in route.query:
            kinds: dict[str, dict[str, Any]] = {
                "string": {"type": "string"},
                "boolean": {"type": "boolean"},
                "integer": {"type": "integer", "minimum": 0},
                "date-time": {"type": "string", "format": "date-time"},
            }
            schema = kinds[param.kind]
            parameters.append(
                {"name": param.name, "in": "query", "required": False, "schema": schema, "description": param.doc}
            )
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": builder.of(route.body)}},
            }
        responses: dict[str, Any] = {}
        if route.status == 204:
            responses["204"] = {"description": "Done."}
        else:
            content = {"application/json": {"schema": builder.of(route.response)}} if route.response else {}
            responses[str(route.status)] = {"description": "Success.", **({"content": content} if content else {})}
        for code in route.errors:
            responses[str(code)] = {
                "description": _ERROR_WORDS[code],
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
            }
        operation["responses"] = responses
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": 'The llmgw admin API. Errors: {"error": {"message", "code", "field"}}.',
        },
        "paths": paths,
        "components": {"schemas": builder.components},
    }
