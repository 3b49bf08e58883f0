"""The admin API's machinery: routes declared once, served by Quart and described by OpenAPI.

Every route names the attrs classes of its body, its query and its answer. The same classes
structure the request (strictly: unknown fields and wrong types are refused, naming the field),
unstructure the answer, and generate the OpenAPI document, so the document cannot drift from
what the server does. Field constraints (``minimum``, ``maxLength``...) live in attrs metadata
under ``"schema"``; they are published in the document and checked here, before any handler
runs, so nothing is written for a request that breaks one.

One error shape for everything: ``{"error": {"message", "code", "field"}}``.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Union, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import ForbiddenExtraKeysError
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from llmgw_shared.config import strict_converter
from llmgw_shared.jsonin import JsonTooDeep
from llmgw_shared.jsonin import loads as json_loads
from llmgw_shared.logs import get_logger

from ...asgi import Send, send_json
from ...store import Conflict, InvalidInput, NotFound, StoreError, StoreUnavailable

log = get_logger("llmgw.admin")

PREFIX = "/api/v1"
# The store keeps integers as BIGINT; anything larger is refused here rather than by a driver.
MAX_INT = 2**62


class ApiError(Exception):
    """An answer other than success; ``field`` names the input at fault (``profiles[0].context``)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


def bad_request(field: str | None, message: str, code: str = "invalid_request") -> ApiError:
    return ApiError(400, code, f"{field}: {message}" if field else message, field)


def not_found(kind: str, key: str, field: str | None = None) -> ApiError:
    return ApiError(404, "not_found", f"{kind} {key!r} not found", field)


def conflict(message: str, field: str | None = None, code: str = "conflict") -> ApiError:
    return ApiError(409, code, message, field)


def error_json(code: str, message: str, field: str | None = None) -> bytes:
    """The admin API's one error shape."""
    return json.dumps({"error": {"message": message, "code": code, "field": field}}).encode()


def error_body(status: int, code: str, message: str, field: str | None = None) -> Response:
    return Response(error_json(code, message, field), status=status, content_type="application/json")


async def send_error(send: Send, status: int, code: str, message: str) -> None:
    """The same error from the plain ASGI layers in front of the admin app."""
    await send_json(send, status, error_json(code, message))


def from_store_error(exc: StoreError) -> ApiError:
    if isinstance(exc, InvalidInput):
        return ApiError(400, "invalid_request", str(exc), exc.field)
    if isinstance(exc, NotFound):
        return ApiError(404, "not_found", str(exc))
    if isinstance(exc, Conflict):
        return ApiError(409, "conflict", str(exc), exc.field)
    if isinstance(exc, StoreUnavailable):
        return ApiError(503, "store_unavailable", f"the store is unavailable: {exc}")
    return ApiError(503, "store_error", f"the store failed: {exc}")


# --------------------------------------------------------------------------- converting


def _clean_str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    # NUL is refused by PostgreSQL and a lone surrogate by every encoder: say so here, as a 400,
    # instead of failing in the driver.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (a lone surrogate)") from None
    return value


def _datetime_in(value: Any, _: type) -> datetime:
    """An RFC 3339 date-time, as a UTC datetime: the one parser of every date-time the API takes.

    Its instant must be one Python can hold in UTC: ``9999-12-31T23:59:59-14:00`` is valid RFC
    3339, but its UTC instant is in the year 10000, and converting it raised OverflowError (a 500)
    wherever it was first compared or stored. Converted here, once, it is a 400 naming the field.
    """
    if not isinstance(value, str):
        raise TypeError(f"expected an RFC 3339 date-time string, got {type(value).__name__}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value[:64]!r} is not an RFC 3339 date-time (e.g. 2026-12-02T10:00:00Z)") from None
    if parsed.tzinfo is None:
        raise ValueError("needs a timezone (e.g. Z or +01:00)")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{value[:64]!r} is out of range: in UTC it must lie between 0001-01-01T00:00:00Z and "
                         "9999-12-31T23:59:59.999999Z") from None


def make_converter() -> cattrs.Converter:
    converter = strict_converter()
    # strict_converter already refuses a string where a list belongs ("tiny" -> ["t","i",...]).
    converter.register_structure_hook(str, _clean_str)
    converter.register_structure_hook(datetime, _datetime_in)
    converter.register_unstructure_hook(datetime, lambda d: d.astimezone(UTC).isoformat().replace("+00:00", "Z"))
    return converter


CONVERTER = make_converter()


def _path_text(path: str) -> str:
    """cattrs' ``$.profiles[0].weights`` as ``profiles[0].weights``."""
    return path.removeprefix("$").removeprefix(".")


def _first_problem(exc: BaseException, path: str = "$") -> tuple[str, str]:
    """The first leaf failure of a cattrs error tree as (field, message)."""
    if isinstance(exc, ForbiddenExtraKeysError):
        unknown = sorted(exc.extra_fields)[0]
        known = sorted(a.name for a in attrs.fields(exc.cl)) if attrs.has(exc.cl) else []
        field = f"{_path_text(path)}.{unknown}".lstrip(".")
        return field, f"unknown field (known: {', '.join(known)})"
    if isinstance(exc, cattrs.BaseValidationError):
        for sub in exc.exceptions:
            note = next((n for n in getattr(sub, "__notes__", []) if hasattr(n, "name") or hasattr(n, "index")),
                        None)
            if note is not None and hasattr(note, "name"):
                sub_path = f"{path}.{note.name}"
            elif note is not None and isinstance(note.index, str):
                sub_path = f"{path}.{note.index}"  # a mapping's key: env.HOME, labels.zone
            elif note is not None:
                sub_path = f"{path}[{note.index!r}]"
            else:
                sub_path = path
            return _first_problem(sub, sub_path)
        return _path_text(path) or "(body)", str(exc)
    if isinstance(exc, KeyError):
        return _path_text(path) or "(body)", "required field missing"
    return _path_text(path) or "(body)", str(exc) or type(exc).__name__


def _check_constraints(value: Any, cls: type, path: str) -> None:
    """The ``schema`` metadata of each field, enforced on a structured value."""
    for field in attrs.fields(cls):
        item = getattr(value, field.name)
        where = f"{path}.{field.name}" if path else field.name
        _check_value(item, field.metadata.get("schema", {}), where)
        if attrs.has(type(item)):
            _check_constraints(item, type(item), where)
        elif isinstance(item, list):
            for i, element in enumerate(item):
                if attrs.has(type(element)):
                    _check_constraints(element, type(element), f"{where}[{i}]")


def _check_value(item: Any, rules: Mapping[str, Any], where: str) -> None:
    if item is None:
        return
    if isinstance(item, int | float) and not isinstance(item, bool):
        if isinstance(item, int) and abs(item) > MAX_INT:
            raise bad_request(where, "is too large")
        if (isinstance(item, float) and item != item) or item in (float("inf"), float("-inf")):
            raise bad_request(where, "must be a finite number")
        if "minimum" in rules and item < rules["minimum"]:
            raise bad_request(where, f"must be at least {rules['minimum']}")
        if "maximum" in rules and item > rules["maximum"]:
            raise bad_request(where, f"must be at most {rules['maximum']}")
    if isinstance(item, str):
        if "minLength" in rules and len(item) < rules["minLength"]:
            raise bad_request(where, "must not be empty" if rules["minLength"] == 1
                              else f"must be at least {rules['minLength']} characters")
        if "maxLength" in rules and len(item) > rules["maxLength"]:
            raise bad_request(where, f"must be at most {rules['maxLength']} characters")
        # Schema patterns are written anchored (^...$) and matched whole: re.search with "$" would
        # also accept the value with a newline after it.
        if "pattern" in rules and not re.fullmatch(rules["pattern"], item):
            raise bad_request(where, rules.get("x-pattern-message", f"must match {rules['pattern']}"))
    if isinstance(item, list | dict):
        if "maxItems" in rules and len(item) > rules["maxItems"]:
            raise bad_request(where, f"must have at most {rules['maxItems']} items")
        if "maxProperties" in rules and len(item) > rules["maxProperties"]:
            raise bad_request(where, f"must have at most {rules['maxProperties']} entries")
    if isinstance(item, list) and "items" in rules:
        for i, element in enumerate(item):
            _check_value(element, rules["items"], f"{where}[{i}]")
    if isinstance(item, dict) and "additionalProperties" in rules:
        for key, element in item.items():
            _check_value(key, rules.get("propertyNames", {}), f"{where}.{key}")
            _check_value(element, rules["additionalProperties"], f"{where}.{key}")


def structure_body(data: Any, cls: type[Any]) -> Any:
    """``data`` (parsed JSON) as ``cls``, or a 400 naming the first field at fault."""
    if not isinstance(data, dict):
        raise bad_request(None, "the body must be a JSON object")
    try:
        value = CONVERTER.structure(data, cls)
    except (cattrs.BaseValidationError, ForbiddenExtraKeysError, KeyError, TypeError, ValueError) as exc:
        field, message = _first_problem(exc)
        raise bad_request(field, message) from None
    _check_constraints(value, cls, "")
    return value


# --------------------------------------------------------------------------- JSON Schema


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


# --------------------------------------------------------------------------- routes


@attrs.frozen
class Param:
    """A query parameter: its name, type and constraints (used for parsing and the document)."""

    name: str
    kind: Literal["string", "boolean", "date-time"] = "string"
    doc: str = ""


@attrs.frozen
class Call:
    """What a handler receives: path parameters, the structured body, the raw body, the query."""

    path: dict[str, str]
    body: Any
    raw: dict[str, Any]
    query: dict[str, Any]


Handler = Callable[[Call], Awaitable[Any]]


@attrs.frozen
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    body: type | None = None
    response: type | None = None
    status: int = 200
    errors: tuple[int, ...] = ()
    query: tuple[Param, ...] = ()


_PATH_PARAM = re.compile(r"\{([a-z_]+)\}")


class Api:
    """The route table: ``route`` declares, ``install`` serves, ``openapi`` describes."""

    def __init__(self) -> None:
        self.routes: list[Route] = []
        self._installed = 0

    def route(
        self, method: str, path: str, *, summary: str, tag: str, body: type | None = None,
        response: type | None = None, status: int = 200, errors: tuple[int, ...] = (),
        query: tuple[Param, ...] = (),
    ) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            # Every route refuses unknown query parameters, so every route may answer 400.
            codes = {*errors, 400, *((413,) if body is not None else ())}
            self.routes.append(Route(method, PREFIX + path, handler, summary, tag, body, response, status,
                                     tuple(sorted(codes)), query))
            return handler
        return register

    def install(self, app: QuartTrio) -> None:
        """Serve the routes declared since the last call."""
        for number in range(self._installed, len(self.routes)):
            route = self.routes[number]
            rule = _PATH_PARAM.sub(r"<\1>", route.path)
            app.add_url_rule(rule, endpoint=f"api_{number}", view_func=self._view(route), methods=[route.method])
        self._installed = len(self.routes)

    def _view(self, route: Route) -> Callable[..., Awaitable[Response]]:
        async def view(**path: str) -> Response:
            try:
                call = await self._read(route, path)
                result = await route.handler(call)
            except ApiError as exc:
                return error_body(exc.status, exc.code, exc.message, exc.field)
            except StoreError as exc:
                err = from_store_error(exc)
                return error_body(err.status, err.code, err.message, err.field)
            except HTTPException:
                raise  # Quart's own (a body over the limit: 413): its handlers answer in our shape
            except Exception:
                # A bug: logged with its traceback, answered in the one error shape without it.
                log.exception("admin API %s %s failed", route.method, route.path)
                return error_body(500, "internal_error", "internal error (see the control daemon's log)")
            if route.status == 204 or result is None:
                return Response("", status=204)
            return Response(json.dumps(CONVERTER.unstructure(result)), status=route.status,
                            content_type="application/json")
        return view

    async def _read(self, route: Route, path: dict[str, str]) -> Call:
        for name, value in path.items():
            try:
                _clean_str(value, str)
            except (TypeError, ValueError) as exc:
                raise bad_request(name, str(exc)) from None
        query = _parse_query(route.query, request.args)
        raw: dict[str, Any] = {}
        body = None
        if route.body is not None:
            data = await request.get_data(as_text=False)
            try:
                parsed = json_loads(data) if data else None
            except JsonTooDeep as exc:
                raise bad_request(None, f"the body is not valid JSON: {exc}", code="invalid_json") from None
            except ValueError:  # UnicodeDecodeError included
                raise bad_request(None, "the body is not valid JSON", code="invalid_json") from None
            body = structure_body(parsed, route.body)
            raw = parsed if isinstance(parsed, dict) else {}
        return Call(path, body, raw, query)

    def openapi(self, title: str, version: str) -> dict[str, Any]:
        builder = SchemaBuilder()
        builder.of(ErrorBody)
        paths: dict[str, Any] = {}
        for route in self.routes:
            operation: dict[str, Any] = {
                "operationId": route.handler.__name__, "summary": route.summary, "tags": [route.tag],
            }
            parameters = [{"name": name, "in": "path", "required": True,
                           "schema": {"type": "string", "minLength": 1}} for name in _PATH_PARAM.findall(route.path)]
            for param in route.query:
                schema: dict[str, Any] = {"string": {"type": "string"}, "boolean": {"type": "boolean"},
                                          "date-time": {"type": "string", "format": "date-time"}}[param.kind]
                parameters.append({"name": param.name, "in": "query", "required": False, "schema": schema,
                                   "description": param.doc})
            if parameters:
                operation["parameters"] = parameters
            if route.body is not None:
                operation["requestBody"] = {"required": True, "content": {
                    "application/json": {"schema": builder.of(route.body)}}}
            responses: dict[str, Any] = {}
            if route.status == 204:
                responses["204"] = {"description": "Done."}
            else:
                content = {"application/json": {"schema": builder.of(route.response)}} if route.response else {}
                responses[str(route.status)] = {"description": "Success.", **({"content": content} if content else {})}
            for code in route.errors:
                responses[str(code)] = {"description": _ERROR_WORDS[code], "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
            operation["responses"] = responses
            paths.setdefault(route.path, {})[route.method.lower()] = operation
        return {
            "openapi": "3.1.0",
            "info": {"title": title, "version": version,
                     "description": "The llmgw admin API. Errors: {\"error\": {\"message\", \"code\", \"field\"}}."},
            "paths": paths,
            "components": {"schemas": builder.components},
        }


_ERROR_WORDS = {
    400: "Bad input; `field` names it.",
    404: "The object addressed does not exist.",
    409: "The change contradicts what exists (a duplicate, an object in use, a model from the config file).",
    413: "The body is larger than 1 MiB.",
    503: "The store is unavailable, or this daemon is not ready.",
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


def _parse_query(params: tuple[Param, ...], args: Any) -> dict[str, Any]:
    known = {p.name: p for p in params}
    for name in args:
        if name not in known:
            allowed = ", ".join(known) or "none"
            raise bad_request(name, f"unknown query parameter (known: {allowed})")
    out: dict[str, Any] = {}
    for name, param in known.items():
        values = args.getlist(name)
        if not values:
            continue
        if len(values) > 1:
            raise bad_request(name, "given more than once")
        value = values[0]
        try:
            _clean_str(value, str)
        except ValueError as exc:
            raise bad_request(name, str(exc)) from None
        if param.kind == "boolean":
            if value not in ("true", "false"):
                raise bad_request(name, "must be true or false")
            out[name] = value == "true"
        elif param.kind == "date-time":
            try:
                out[name] = _datetime_in(value, datetime)
            except ValueError as exc:
                raise bad_request(name, str(exc)) from None
        else:
            out[name] = value
    return out
