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
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

import attrs
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from llmgw_shared.jsonin import JsonTooDeep
from llmgw_shared.jsonin import loads as json_loads
from llmgw_shared.logs import get_logger

from ...api_errors import AdminApiError, admin_error_json, bad_request
from ...documents import CONVERTER, clean_str, datetime_in
from ...store import Conflict, InvalidInput, NotFound, StoreError, StoreUnavailable, audit_scope
from ...transport.asgi import Send, send_json
from ..audit_log import ACTOR_HEADER, LOOPBACK, AuditLog, peer_of
from ..standby_refusal import StandbyRefusal
from .openapi import PATH_PARAM, openapi_document
from .validate import structure_body

log = get_logger(__name__)

PREFIX = "/api/v1"


def error_body(status: int, code: str, message: str, field: str | None = None) -> Response:
    return Response(admin_error_json(code, message, field), status=status, content_type="application/json")


def refusal_body(exc: AdminApiError) -> Response:
    """An ``AdminApiError`` as the answer; a standby's refusal also names the leader, in the body
    (``error.leader``) and in its headers, so a caller can retry there without parsing the message."""
    if not isinstance(exc, StandbyRefusal):
        return error_body(exc.status, exc.code, exc.message, exc.field)
    body = {"error": {"message": exc.message, "code": exc.code, "field": exc.field, "leader": exc.leader}}
    response = Response(json.dumps(body), status=exc.status, content_type="application/json")
    for name, value in exc.headers:
        response.headers[name] = value
    return response


async def send_error(send: Send, status: int, code: str, message: str) -> None:
    """The same error from the plain ASGI layers in front of the admin app."""
    await send_json(send, status, admin_error_json(code, message))


def from_store_error(exc: StoreError) -> AdminApiError:
    if isinstance(exc, InvalidInput):
        return AdminApiError(400, "invalid_request", str(exc), exc.field)
    if isinstance(exc, NotFound):
        return AdminApiError(404, "not_found", str(exc))
    if isinstance(exc, Conflict):
        return AdminApiError(409, "conflict", str(exc), exc.field)
    if isinstance(exc, StoreUnavailable):
        return AdminApiError(503, "store_unavailable", f"the store is unavailable: {exc}")
    return AdminApiError(503, "store_error", f"the store failed: {exc}")


@attrs.frozen
class Param:
    """A query parameter: its name, type and constraints (used for parsing and the document)."""

    name: str
    kind: Literal["string", "boolean", "integer", "date-time"] = "string"
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


class Api:
    """The route table: ``route`` declares, ``install`` serves, ``openapi`` describes."""

    def __init__(self) -> None:
        self.routes: list[Route] = []
        self._installed = 0
        # Every route that is not a GET changes state: each is one audited action (set by the app).
        self.audit: AuditLog | None = None

    def route(
        self,
        method: str,
        path: str,
        *,
        summary: str,
        tag: str,
        body: type | None = None,
        response: type | None = None,
        status: int = 200,
        errors: tuple[int, ...] = (),
        query: tuple[Param, ...] = (),
    ) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            # Every route refuses unknown query parameters, so every route may answer 400.
            codes = {*errors, 400, *((413,) if body is not None else ())}
            self.routes.append(
                Route(method, PREFIX + path, handler, summary, tag, body, response, status, tuple(sorted(codes)), query)
            )
            return handler

        return register

    def install(self, app: QuartTrio) -> None:
        """Serve the routes declared since the last call."""
        for number in range(self._installed, len(self.routes)):
            route = self.routes[number]
            rule = PATH_PARAM.sub(r"<\1>", route.path)
            app.add_url_rule(rule, endpoint=f"api_{number}", view_func=self._view(route), methods=[route.method])
        self._installed = len(self.routes)

    def _view(self, route: Route) -> Callable[..., Awaitable[Response]]:
        async def view(**path: str) -> Response:
            if route.method == "GET" or self.audit is None:
                return (await self._answer(route, path))[0]
            audit = self.audit
            actor = request.headers.get(ACTOR_HEADER.decode()) or LOOPBACK
            peer = peer_of(request.scope)
            action = f"{route.method} {route.path}"
            scope = audit.begin(
                actor=actor, peer=peer, action=action, resource=route.tag, resource_id=next(iter(path.values()), "")
            )
            # Every store write the handler makes (however deep) records itself under this scope.
            with audit_scope(scope):
                response, refusal = await self._answer(route, path)
            if response.status_code < 400:
                await audit.finish(scope)
            elif isinstance(refusal, StandbyRefusal):
                await audit.refused(actor=actor, peer=peer, action=action, reason="standby")
            return response

        return view

    async def _answer(self, route: Route, path: dict[str, str]) -> tuple[Response, AdminApiError | None]:
        """The route's answer, and the refusal it raised, if it did."""
        try:
            call = await self._read(route, path)
            result = await route.handler(call)
        except AdminApiError as exc:
            return refusal_body(exc), exc
        except StoreError as exc:
            err = from_store_error(exc)
            return error_body(err.status, err.code, err.message, err.field), err
        except HTTPException:
            raise  # Quart's own (a body over the limit: 413): its handlers answer in our shape
        except Exception:
            # A bug: logged with its traceback, answered in the one error shape without it.
            log.exception("admin API %s %s failed", route.method, route.path)
            return error_body(500, "internal_error", "internal error (see the control daemon's log)"), None
        if route.status == 204 or result is None:
            return Response("", status=204), None
        return Response(
            json.dumps(CONVERTER.unstructure(result)), status=route.status, content_type="application/json"
        ), None

    async def _read(self, route: Route, path: dict[str, str]) -> Call:
        for name, value in path.items():
            try:
                clean_str(value, str)
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
        return openapi_document(self.routes, title, version)


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
            clean_str(value, str)
        except ValueError as exc:
            raise bad_request(name, str(exc)) from None
        if param.kind == "boolean":
            if value not in ("true", "false"):
                raise bad_request(name, "must be true or false")
            out[name] = value == "true"
        elif param.kind == "integer":
            # Digits only: int() would take " 7", "+7", "7_000" and 4,300 digits of work.
            if not value.isascii() or not value.isdigit() or len(value) > 9:
                raise bad_request(name, "must be a whole number of at most 9 digits")
            out[name] = int(value)
        elif param.kind == "date-time":
            try:
                out[name] = datetime_in(value, datetime)
            except ValueError as exc:
                raise bad_request(name, str(exc)) from None
        else:
            out[name] = value
    return out
