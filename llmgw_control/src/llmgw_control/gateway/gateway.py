"""The OpenAI endpoints as a plain ASGI application.

The data path is written against ASGI directly rather than through Quart's response objects:
a Quart streaming body runs after the handler has returned, outside the scope that opened the
upstream request, so a client that disconnects before the first body iteration leaves the
upstream request open. Here one function owns the whole exchange -- read, pick, connect, relay --
inside one nursery, and the upstream response is an ``async with`` that closes the moment the
client goes away. It also saves Quart's 0.2-0.5 ms per request on the hot path. The admin API and
pages, which are not hot, use Quart.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from typing import Any

import trio

from llmgw_shared.jsonin import loads as json_loads
from llmgw_shared.logs import get_logger, request_context

from ..api_errors import ClientApiError, model_not_found, sse_error_event
from ..priority import Priority
from ..tenancy.admission import Admission, Ticket
from ..transport.asgi import REQUEST_ID, Receive, Scope, Send
from .activator import Activator, Refusal, Slot
from .config import RouterConfig
from .directory import ModelDirectory, StaticDirectory
from .metrics import GatewayMetrics
from .replicas import Replica, ReplicaSet
from .requests import ENDPOINTS, ClientGone, ParsedRequest, parse_request, read_body
from .upstream import UpstreamBodyError, UpstreamClient, UpstreamClosedEarly, UpstreamError, UpstreamResponse
from .usage import StreamTail, Usage, find_usage

log = get_logger("llmgw.router")
access_log = get_logger("llmgw.access")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
# Engine response headers worth passing on; connection management and framing are ours.
_PASS_HEADERS = frozenset({"content-type", "cache-control"})
_ERROR_BODY_LIMIT = 64 * 1024
# Chunks read ahead of a slow client before the reader waits (backpressure to the engine).
_RELAY_QUEUE = 64


class _Retryable(Exception):
    """This attempt failed before anything reached the client: another replica may serve it."""

    def __init__(self, error: ClientApiError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


class Exchange:
    """One client request: what was sent back, and the figures the access log and metrics need."""

    def __init__(self, send: Send, request_id: str) -> None:
        self._send = send
        self.request_id = request_id
        self.started = time.perf_counter()
        self.response_started = False
        self.status = 0
        self.model = ""
        self.replica = ""
        self.stream = False
        self.upstream_seconds = 0.0
        self.chunks_sent = 0
        self.frozen_overhead: float | None = None
        # Time waiting for a slot (or for a replica to start): neither llmgw's work nor the engine's.
        self.queued_seconds = 0.0
        self.ttft: float | None = None
        self.usage: Usage | None = None
        self.client_gone = False
        # Set as the last bytes are handed to the server (hypercorn reports the disconnect of a
        # finished request before our send returns): a disconnect after that is not an abort.
        self.complete = False

    def overhead(self) -> float:
        if self.frozen_overhead is not None:
            return self.frozen_overhead
        return max(0.0, time.perf_counter() - self.started - self.upstream_seconds - self.queued_seconds)

    def freeze_overhead(self) -> None:
        self.frozen_overhead = self.overhead()

    def _headers(self, extra: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        headers = [(b"x-request-id", self.request_id.encode())]
        if self.replica:
            headers.append((b"x-llmgw-replica", self.replica.encode()))
        if self.queued_seconds:
            headers.append((b"x-llmgw-queued-ms", f"{self.queued_seconds * 1000:.1f}".encode()))
        headers.append((b"x-llmgw-overhead-ms", f"{self.overhead() * 1000:.3f}".encode()))
        return extra + headers

    async def respond(self, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
        self.status = status
        self.response_started = True
        await self._send({
            "type": "http.response.start", "status": status,
            "headers": self._headers([(b"content-type", content_type),
                                      (b"content-length", str(len(body)).encode())]),
        })
        self.complete = True
        await self._send({"type": "http.response.body", "body": body})

    async def respond_json(self, status: int, value: Any) -> None:
        await self.respond(status, json.dumps(value).encode())

    async def send_error(self, error: ClientApiError) -> None:
        if self.response_started:
            await self.send_chunk(sse_error_event(error))
            self.status = error.status
            return
        self.status = error.status
        self.response_started = True
        body = error.encoded()
        extra = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        extra += [(k.encode(), v.encode()) for k, v in error.headers]
        await self._send({"type": "http.response.start", "status": error.status, "headers": self._headers(extra)})
        self.complete = True
        await self._send({"type": "http.response.body", "body": body})

    async def start_stream(self, status: int, content_type: bytes) -> None:
        self.status = status
        self.response_started = True
        await self._send({
            "type": "http.response.start", "status": status,
            "headers": self._headers([(b"content-type", content_type), (b"cache-control", b"no-cache"),
                                      # nginx in front would otherwise buffer the stream
                                      (b"x-accel-buffering", b"no")]),
        })

    async def send_chunk(self, chunk: bytes, events: int = 1) -> None:
        # Events relayed: with no usage from the engine, about one token each.
        self.chunks_sent += events
        if self.ttft is None:
            self.ttft = time.perf_counter() - self.started
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end_stream(self) -> None:
        self.complete = True
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _request_id(scope: Scope) -> str:
    given = _header(scope, b"x-request-id")
    if given and _REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


def _engine_message(body: bytes) -> str:
    try:
        value = json_loads(body)
        error = value.get("error") if isinstance(value, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
        if isinstance(error, str):
            return error[:300]
    except ValueError:
        pass
    return body.decode("utf-8", "replace").strip()[:300] or "(empty body)"


class Gateway:
    def __init__(
        self,
        replicas: ReplicaSet,
        upstream: UpstreamClient,
        metrics: GatewayMetrics,
        config: RouterConfig,
        *,
        directory: ModelDirectory | None = None,
        activator: Activator | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.replicas = replicas
        self.upstream = upstream
        self.metrics = metrics
        self.config = config
        self.directory = directory or StaticDirectory(replicas)
        # Router-only mode has no reconciler to start replicas, but its endpoints' slots are
        # admitted the same way.
        self.activator = activator or Activator(replicas)
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(send, _request_id(scope))
        with request_context(exchange.request_id):
            try:
                await self._dispatch(scope, receive, exchange)
            except ClientApiError as error:
                await exchange.send_error(error)
            except ClientGone:
                exchange.client_gone = True
            except Exception:
                log.exception("unexpected error while serving %s %s", scope["method"], scope["path"])
                if not exchange.response_started:
                    await exchange.send_error(ClientApiError(
                        500, f"Internal error in the gateway (request id {exchange.request_id}).",
                        code="internal_error"))
            finally:
                self._record(scope, exchange)

    async def _dispatch(self, scope: Scope, receive: Receive, exchange: Exchange) -> None:
        # For the server's own log line should the connection fail while this request is served.
        scope[REQUEST_ID] = exchange.request_id
        path: str = scope["path"]
        method: str = scope["method"]
        endpoint = ENDPOINTS.get(path)
        if endpoint is not None:
            if method != "POST":
                raise ClientApiError(405, f"Method {method} is not allowed on {path}; use POST.", code="method_not_allowed")
            authorization = _header(scope, b"authorization")
            # Who is asking comes first, on the head: a client without a key gets its 401 before
            # its body is invited (no 100 Continue) or read, and learns no model names.
            allowed = self.admission.authenticate(authorization) if self.admission is not None else None
            length = _header(scope, b"content-length")
            body = await read_body(
                receive, content_length=int(length) if length and length.isdigit() else None,
                limit=self.config.max_body_bytes,
            )
            request = parse_request(endpoint, body)
            key = self.directory.resolve(request.model)
            if key is None:
                raise model_not_found(request.model, self._visible(allowed), restricted=allowed is not None)
            exchange.model = key
            exchange.stream = request.stream
            if self.admission is None:
                await self._forward(request, key, receive, exchange)
                return
            estimate = _estimate_tokens(request)
            ticket = self.admission.admit(authorization, key.partition(":")[0], estimated_tokens=sum(estimate))
            try:
                await self._forward(request, key, receive, exchange, ticket.priority)
            finally:
                _settle(ticket, exchange, estimate)
        elif path.startswith("/v1/models") and method == "GET":
            allowed = self.admission.authenticate(_header(scope, b"authorization")) if self.admission else None
            await self._models(path, exchange, allowed)
        elif path == "/healthz":
            await exchange.respond_json(200, {"status": "ok", "replicas": len(self.replicas)})
        else:
            raise ClientApiError(404, f"Unknown request URL: {method} {path}.", code="unknown_url")

    async def _models(self, path: str, exchange: Exchange, allowed: frozenset[str] | None) -> None:
        visible = self._visible(allowed)
        if path == "/v1/models":
            await exchange.respond_json(200, {"object": "list", "data": [_model_card(m) for m in visible]})
            return
        name = path.removeprefix("/v1/models/")
        if not self._may_see(name, allowed):
            raise model_not_found(name, visible, restricted=allowed is not None)
        await exchange.respond_json(200, _model_card(name))

    def _may_see(self, name: str, allowed: frozenset[str] | None) -> bool:
        key = self.directory.resolve(name)
        # As ``admit`` checks an allow-list: by the model, whatever the profile.
        return key is not None and (allowed is None or key.partition(":")[0] in allowed)

    def _visible(self, allowed: frozenset[str] | None) -> list[str]:
        """The model names a key may see: all of them, or those its allow-list names."""
        names = self.directory.names()
        return names if allowed is None else [name for name in names if self._may_see(name, allowed)]

    async def _forward(
        self, request: ParsedRequest, key: str, receive: Receive, exchange: Exchange,
        priority: Priority = Priority.INTERACTIVE,
    ) -> None:
        in_flight = self.metrics.in_flight.labels(key)
        in_flight.inc()
        failure: Exception | None = None
        try:
            async with trio.open_nursery() as nursery:
                # Inside the nursery, so a client that gives up stops waiting for a slot too.
                nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope, exchange)
                try:
                    await self._attempts(request, key, exchange, priority)
                except Exception as exc:
                    # Re-raised below the nursery, so callers see the error itself rather than
                    # an exception group wrapping it.
                    failure = exc
                nursery.cancel_scope.cancel()
        finally:
            in_flight.dec()
        if failure is not None:
            raise failure

    async def _attempts(self, request: ParsedRequest, key: str, exchange: Exchange, priority: Priority) -> None:
        activator = self.activator
        tried: frozenset[str] = frozenset()
        failure: ClientApiError | None = None
        for attempt in range(self.config.max_attempts):
            slot = activator.try_acquire(key, tried)
            if slot is None:
                outcome = await self._queue(key, exchange, priority, tried, retry=bool(attempt))
                if outcome is Refusal.EXHAUSTED:
                    break
                if isinstance(outcome, Refusal):
                    raise activator.refusal_error(outcome, key)
                slot = outcome
            with slot:
                replica = slot.replica
                if attempt:
                    self.metrics.retries.labels(replica.id, "other_replica").inc()
                tried = tried | {replica.id}
                exchange.replica = replica.id
                try:
                    await self._attempt(replica, request, exchange)
                    return
                except _Retryable as retry:
                    failure = retry.error
                    replica.cooldown_until = trio.current_time() + self.config.cooldown
                    self.metrics.cooldowns.labels(replica.id).inc()
                    log.warning("replica %s failed (%s): %s", replica.id, retry.reason, retry.error.message,
                                extra={"replica": replica.id, "model": key})
        raise failure or ClientApiError(
            503, f"No replica of model '{request.model}' is available.", code="no_replica_available")

    async def _queue(
        self, key: str, exchange: Exchange, priority: Priority, tried: frozenset[str], *, retry: bool
    ) -> Slot | Refusal:
        """Wait for a slot; the time waited is the queue's, neither llmgw's work nor the engine's."""
        held = time.perf_counter()
        outcome: Slot | Refusal | None = None
        try:
            outcome = await self.activator.wait(key, priority, exclude=tried, front=retry)
        finally:
            # Refused at once (queue full, nothing left to try): that request never waited.
            if outcome is not Refusal.OVERFLOW and outcome is not Refusal.EXHAUSTED:
                waited = time.perf_counter() - held
                exchange.queued_seconds += waited
                self.metrics.queue_wait.labels(key).observe(waited)
        if isinstance(outcome, Refusal) and outcome is not Refusal.EXHAUSTED:
            self.metrics.queue_refusals.labels(key, outcome.value).inc()
        return outcome

    async def _attempt(self, replica: Replica, request: ParsedRequest, exchange: Exchange) -> None:
        headers = [("content-type", "application/json"), ("accept", "application/json, text/event-stream"),
                   ("x-request-id", exchange.request_id)]
        if replica.api_key:
            headers.append(("authorization", f"Bearer {replica.api_key}"))
        url = replica.url + request.endpoint.path
        gauge = self.metrics.replica_in_flight.labels(replica.id)
        gauge.inc()
        try:
            # One silent retry on a fresh connection: a pooled connection the engine closed
            # after its last stream fails before any response byte.
            for fresh_connection in (False, True):
                try:
                    await self._exchange_with(replica, url, headers, request, exchange)
                    return
                except UpstreamClosedEarly as exc:
                    if fresh_connection:
                        raise _Retryable(ClientApiError(
                            502, f"Replica {replica.id} closed the connection before answering (phase: "
                                 f"first_byte): {exc}", code="upstream_closed"), "closed") from None
                    self.metrics.retries.labels(replica.id, "stale_connection").inc()
                except UpstreamError as exc:
                    # A connect error, or anything else the upstream client could not send.
                    raise _Retryable(ClientApiError(
                        502, f"Replica {replica.id} could not be reached (phase: connect): {exc}",
                        code="upstream_connect_error"), "connect") from None
        finally:
            gauge.dec()

    async def _exchange_with(
        self, replica: Replica, url: str, headers: list[tuple[str, str]], request: ParsedRequest, exchange: Exchange
    ) -> None:
        config = self.config
        body = request.body
        if replica.served_name and replica.served_name != request.model:
            # Engines such as vLLM check the name; llama-server ignores it (then it is not set).
            body = json.dumps({**request.payload, "model": replica.served_name}).encode()
        waited = time.perf_counter()
        answered = False
        try:
            # One scope for the wait for the response head, lifted once it is in: a second
            # scope (or an exit stack to nest one) per request is measurable on this path.
            with trio.CancelScope(deadline=trio.current_time() + config.first_byte_timeout) as head:
                async with self.upstream.open("POST", url, headers=headers, body=body,
                                              connect_timeout=config.connect_timeout) as response:
                    head.deadline = math.inf
                    answered = True
                    exchange.upstream_seconds += time.perf_counter() - waited
                    await self._relay(replica, response, exchange)
        finally:
            if not answered:
                exchange.upstream_seconds += time.perf_counter() - waited
        if head.cancelled_caught:
            raise ClientApiError(504, f"Replica {replica.id} did not answer within {config.first_byte_timeout:g} s "
                                "(phase: first_byte).", code="upstream_timeout")

    async def _read_all(
        self, replica: Replica, response: UpstreamResponse, exchange: Exchange, limit: int | None = None
    ) -> bytes:
        """The whole body; ClientApiError when the engine stalls for the idle timeout or breaks off."""
        idle = self.config.idle_timeout
        parts = []
        size = 0
        waited = time.perf_counter()
        try:
            with trio.CancelScope(deadline=trio.current_time() + idle) as stalled:
                while (chunk := await response.next_chunk()) is not None:
                    parts.append(chunk)
                    size += len(chunk)
                    if limit is not None and size >= limit:
                        break
                    stalled.deadline = trio.current_time() + idle
        except UpstreamBodyError as exc:
            raise ClientApiError(502, f"Replica {replica.id} broke off its response (phase: body): {exc}",
                           code="upstream_broken") from None
        finally:
            exchange.upstream_seconds += time.perf_counter() - waited
        if stalled.cancelled_caught:
            raise ClientApiError(504, f"Replica {replica.id} sent nothing for {idle:g} s (phase: body).",
                           code="upstream_timeout")
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _relay(self, replica: Replica, response: UpstreamResponse, exchange: Exchange) -> None:
        status = response.status_code
        if status >= 500:
            try:
                detail = _engine_message(await self._read_all(replica, response, exchange, _ERROR_BODY_LIMIT))
            except ClientApiError as error:
                detail = error.message
            raise _Retryable(ClientApiError(
                502, f"Replica {replica.id} answered {status} (phase: first_byte): {detail}",
                code="upstream_error"), f"http_{status}")
        content_type = response.content_type()
        if not content_type.startswith("text/event-stream"):
            try:
                body = await self._read_all(replica, response, exchange)
            except ClientApiError as error:
                # Nothing has reached the client yet, so another replica may still serve it.
                raise _Retryable(error, "body") from None
            if status < 300:
                exchange.usage = find_usage(body)
            await exchange.respond(status, body, content_type.encode() or b"application/json")
            return
        await exchange.start_stream(status, content_type.encode())
        # From here the overhead figure is fixed: the relay's own time overlaps the engine's.
        exchange.freeze_overhead()
        tail = StreamTail()
        arrived, collected = trio.open_memory_channel[bytes | ClientApiError | None](_RELAY_QUEUE)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_stream, replica, response, arrived)
            failure: ClientApiError | None = None
            done = False
            while not done:
                # Everything the reader has queued goes out as one write: under load that turns
                # dozens of small SSE events into one send, which is most of a stream's CPU.
                parts: list[bytes] = []
                item = await collected.receive()
                while True:
                    if item is None or isinstance(item, ClientApiError):
                        done, failure = True, item
                        break
                    parts.append(item)
                    try:
                        item = collected.receive_nowait()
                    except trio.WouldBlock:
                        break
                if parts:
                    data = parts[0] if len(parts) == 1 else b"".join(parts)
                    tail.feed(data)
                    if b'"usage"' in data:
                        # Taken now: a client that closes right after [DONE] cancels what follows.
                        exchange.usage = tail.usage() or exchange.usage
                    if (done and failure is None) or b"data: [DONE]" in data:
                        # This write carries the end of the answer: a client that hangs up from
                        # here on (the openai client does, right after [DONE]) is done, not gone.
                        exchange.complete = True
                    await exchange.send_chunk(data, events=data.count(b"data:"))
        if failure is not None:
            # Bytes already reached the client: no retry, the error travels as the last event.
            log.warning("stream from replica %s ended early: %s", replica.id, failure.message,
                        extra={"replica": replica.id})
            await exchange.send_error(failure)
        exchange.usage = tail.usage() or exchange.usage
        await exchange.end_stream()

    async def _read_stream(
        self, replica: Replica, response: UpstreamResponse, arrived: trio.MemorySendChannel[bytes | ClientApiError | None]
    ) -> None:
        """Read the engine's stream into the relay queue; ends with None, or the error that ended it."""
        idle = self.config.idle_timeout
        # Moving a cancel scope's deadline goes through trio's deadline heap: done twice per chunk
        # it was a twentieth of a stream's CPU. The deadline is moved at most every ``slack``
        # seconds instead, and set ``slack`` later than due, so it fires between ``idle`` and
        # ``idle + slack`` after the last chunk: never early.
        slack = min(1.0, idle / 10)
        async with arrived:
            # Waiting on a full queue (a slow client) is not idleness: the deadline is lifted then.
            with trio.CancelScope(deadline=trio.current_time() + idle + slack) as waiting:
                refresh_at = trio.current_time() + slack
                try:
                    while (chunk := await response.next_chunk()) is not None:
                        try:
                            arrived.send_nowait(chunk)
                        except trio.WouldBlock:
                            waiting.deadline = math.inf
                            await arrived.send(chunk)
                            refresh_at = 0.0
                        now = trio.current_time()
                        if now >= refresh_at:
                            waiting.deadline = now + idle + slack
                            refresh_at = now + slack
                except UpstreamBodyError as exc:
                    await arrived.send(ClientApiError(502, f"Replica {replica.id} broke off its response (phase: body): "
                                                     f"{exc}", code="upstream_broken"))
                    return
            if waiting.cancelled_caught:
                await arrived.send(ClientApiError(504, f"Replica {replica.id} sent nothing for {idle:g} s (phase: body).",
                                            code="upstream_timeout"))
                return
            await arrived.send(None)

    def _record(self, scope: Scope, exchange: Exchange) -> None:
        status = 499 if exchange.client_gone else exchange.status
        duration = time.perf_counter() - exchange.started
        overhead = exchange.overhead()
        metrics = self.metrics
        metrics.requests.labels(exchange.model, exchange.replica, str(status)).inc()
        if exchange.model:
            metrics.duration.labels(exchange.model).observe(duration)
            metrics.overhead.observe(overhead)
            if exchange.stream and exchange.ttft is not None:
                metrics.ttft.labels(exchange.model).observe(exchange.ttft)
            if exchange.usage is not None:
                metrics.tokens.labels(exchange.model, "prompt").inc(exchange.usage.prompt_tokens)
                metrics.tokens.labels(exchange.model, "completion").inc(exchange.usage.completion_tokens)
        fields: dict[str, Any] = {
            "method": scope["method"], "path": scope["path"], "status": status,
            "duration_ms": round(duration * 1000, 2), "overhead_ms": round(overhead * 1000, 3),
        }
        if exchange.model:
            fields.update(model=exchange.model, replica=exchange.replica, stream=exchange.stream)
        if exchange.ttft is not None:
            fields["ttft_ms"] = round(exchange.ttft * 1000, 2)
        if exchange.usage is not None:
            fields.update(prompt_tokens=exchange.usage.prompt_tokens,
                          completion_tokens=exchange.usage.completion_tokens)
        if exchange.client_gone:
            fields["client_gone"] = True
        # Health checks arrive every few seconds from load balancers: not worth a line each.
        quiet = scope["path"] == "/healthz" and status == 200
        access_log.log(logging.DEBUG if quiet else logging.INFO, "served", extra=fields)


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope, exchange: Exchange) -> None:
    """Cancel the exchange when the client goes away, which closes the upstream request at once."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not exchange.complete:
                exchange.client_gone = True
                scope.cancel()
            return


_DEFAULT_COMPLETION_ESTIMATE = 512


def _estimate_tokens(request: ParsedRequest) -> tuple[int, int]:
    """(prompt, completion) tokens to reserve before the engine says: ~4 bytes a token, max_tokens."""
    payload = request.payload
    completion = payload.get("max_completion_tokens") or payload.get("max_tokens")
    if request.endpoint.kind == "embeddings":
        completion = 0
    elif not isinstance(completion, int):
        completion = _DEFAULT_COMPLETION_ESTIMATE
    return len(request.body) // 4, completion


def _settle(ticket: Ticket, exchange: Exchange, estimate: tuple[int, int]) -> None:
    """Count what was served: the engine's usage, else an estimate; nothing for a failure."""
    if exchange.usage is not None:
        ticket.settle(exchange.usage.prompt_tokens, exchange.usage.completion_tokens)
    elif exchange.response_started and 200 <= exchange.status < 300:
        # Served, but the engine reported no usage (a stream without include_usage, or one cut
        # off): a release would let those tokens escape every quota.
        completion = exchange.chunks_sent if exchange.stream else estimate[1]
        ticket.settle(estimate[0], completion)
    else:
        ticket.release()


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "llmgw"}
