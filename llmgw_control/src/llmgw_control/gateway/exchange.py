"""One client request as the gateway answers it: what was sent back, and the figures the access
log and the metrics take from it (``record``)."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from enum import StrEnum
from typing import Any

from llmgw_shared.logs import get_logger
from llmgw_shared.transitions import ImpossibleTransition, Lifecycle

from ..api_errors import ClientApiError, sse_error_event
from ..transport.asgi import Scope, Send
from .metrics import GatewayMetrics
from .tracing import UNTRACED, RequestTrace
from .usage import TokenUsage

access_log = get_logger("llmgw.access")
log = get_logger(__name__)

# A client's own request id is kept when it is this sane (it lands in logs and headers): at most
# 128 characters a log line or a header can carry as they are.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class ExchangeState(StrEnum):
    """Where an exchange's answer is (h11-style: the legal moves are ``EXCHANGE_LIFECYCLE``'s, nowhere else)."""

    # Nothing sent to the client yet.
    IDLE = "idle"
    # The response head went out (a stream's, or a whole answer's about to follow).
    HEAD_SENT = "head_sent"
    # Body chunks of a stream went out.
    STREAMING = "streaming"
    # The write that carries the end of the answer is under way or done: a disconnect from here on
    # is a client that is done (the openai client hangs up right after [DONE]), not one gone.
    COMPLETE = "complete"
    # The client went away before its answer was complete.
    CLIENT_GONE = "client_gone"


EXCHANGE_LIFECYCLE = Lifecycle(
    "exchange",
    ExchangeState,
    start={ExchangeState.IDLE},
    transitions={
        ExchangeState.IDLE: {ExchangeState.HEAD_SENT, ExchangeState.CLIENT_GONE},
        ExchangeState.HEAD_SENT: {ExchangeState.STREAMING, ExchangeState.COMPLETE, ExchangeState.CLIENT_GONE},
        ExchangeState.STREAMING: {ExchangeState.COMPLETE, ExchangeState.CLIENT_GONE},
        # Writes of the answer's end may follow (the last chunk, the stream's close), changing nothing.
        ExchangeState.COMPLETE: set(),
        # Terminal: nothing reaches the client any more, and what the relay was already doing as the
        # disconnect came in (its cancellation is on the way) changes nothing either.
        ExchangeState.CLIENT_GONE: set(),
    },
)
# The table's rows, read directly by ``Exchange.move``: a move is on every request's path, so it
# is one dict lookup and one set test, not a call into ``Lifecycle.allowed``.
_MOVES = EXCHANGE_LIFECYCLE.transitions


class IllegalTransition(ImpossibleTransition):
    """A move the table does not have: a bug in the gateway (a second response head, say)."""


class Exchange:
    """One client request: what was sent back, and the figures the access log and metrics need."""

    def __init__(self, send: Send, request_id: str) -> None:
        self._send = send
        self.request_id = request_id
        self.started = time.perf_counter()
        self.state = ExchangeState.IDLE
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
        self.usage: TokenUsage | None = None
        # Times the stream was continued on another replica after its engine broke off.
        self.continuations = 0
        # The route's API (its error shape), its kind (metrics, access log) and stream framing.
        self.api = "openai"
        self.kind = ""
        self.stream_format: str | None = None
        # CORS headers for a browser's request from an allowed origin (gateway/cors.py).
        self.cors: list[tuple[bytes, bytes]] = []
        # The request's spans (gateway/tracing.py); UNTRACED when tracing is off or not sampled.
        self.trace: RequestTrace = UNTRACED

    def move(self, to: ExchangeState) -> None:
        """Move to ``to``; staying put is no move (an end's too: the answer's last writes follow
        ``COMPLETE``), and a gone client's exchange stays gone."""
        state = self.state
        if to is state or state is ExchangeState.CLIENT_GONE:
            return
        if to not in _MOVES[state]:
            raise IllegalTransition(f"exchange {self.request_id}: {state.value} -> {to.value}")
        self.state = to

    @property
    def response_started(self) -> bool:
        # Every head carries a status: a status set is a head sent, whatever came after it.
        state = self.state
        return state is not ExchangeState.IDLE and (state is not ExchangeState.CLIENT_GONE or self.status != 0)

    @property
    def complete(self) -> bool:
        """Set as the last bytes are handed to the server (hypercorn reports the disconnect of a
        finished request before our send returns): a disconnect after that is not an abort."""
        return self.state is ExchangeState.COMPLETE

    @complete.setter
    def complete(self, value: bool) -> None:
        assert value, "an exchange is never made incomplete"
        self.move(ExchangeState.COMPLETE)

    @property
    def client_gone(self) -> bool:
        return self.state is ExchangeState.CLIENT_GONE

    @client_gone.setter
    def client_gone(self, value: bool) -> None:
        assert value, "a client that went away does not come back"
        self.move(ExchangeState.CLIENT_GONE)

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
        if self.cors:
            headers += self.cors
        return extra + headers

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.move(ExchangeState.HEAD_SENT)
        self.status = status
        await self._send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": self._headers(
                    [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *(extra or ())]
                ),
            }
        )
        self.move(ExchangeState.COMPLETE)
        await self._send({"type": "http.response.body", "body": body})

    async def respond_empty(self, status: int, extra: list[tuple[bytes, bytes]]) -> None:
        """An answer without a body (a preflight's 204: no content-length, no content-type)."""
        self.move(ExchangeState.HEAD_SENT)
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": self._headers(extra)})
        self.move(ExchangeState.COMPLETE)
        await self._send({"type": "http.response.body", "body": b""})

    async def respond_json(self, status: int, value: Any) -> None:
        await self.respond(status, json.dumps(value).encode())

    async def send_error(self, error: ClientApiError) -> None:
        if self.response_started:
            await self.send_chunk(sse_error_event(error, self.stream_format))
            self.status = error.status
            return
        self.move(ExchangeState.HEAD_SENT)
        self.status = error.status
        body = error.in_shape(self.api)
        extra = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        extra += [(k.encode(), v.encode()) for k, v in error.headers]
        if error.status == 429 and not any(k.lower() == "retry-after" for k, _ in error.headers):
            # Every 429 says when to come back: the SDKs wait that long before their retry.
            extra.append((b"retry-after", b"1"))
        await self._send({"type": "http.response.start", "status": error.status, "headers": self._headers(extra)})
        self.move(ExchangeState.COMPLETE)
        await self._send({"type": "http.response.body", "body": body})

    async def start_stream(self, status: int, content_type: bytes) -> None:
        self.move(ExchangeState.HEAD_SENT)
        self.status = status
        await self._send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": self._headers(
                    [
                        (b"content-type", content_type),
                        (b"cache-control", b"no-cache"),
                        # nginx in front would otherwise buffer the stream
                        (b"x-accel-buffering", b"no"),
                    ]
                ),
            }
        )

    async def send_chunk(self, chunk: bytes, events: int = 1) -> None:
        # Events relayed: with no usage from the engine, about one token each.
        self.chunks_sent += events
        if self.state is ExchangeState.HEAD_SENT:  # the one check that runs per chunk
            self.move(ExchangeState.STREAMING)
        if self.ttft is None:
            self.ttft = time.perf_counter() - self.started
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end_stream(self) -> None:
        self.move(ExchangeState.COMPLETE)
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def request_id(scope: Scope) -> str:
    given = header(scope, b"x-request-id")
    if given and _REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


def _clamped(exchange: Exchange, metrics: GatewayMetrics) -> None:
    """Counts the engine reported out of bounds (gateway/usage.py clamped them): named, with the
    replica that reported them, once a request."""
    assert exchange.usage is not None
    clamped = exchange.usage.clamped
    if not clamped:
        return
    for clamp in clamped:
        metrics.usage_clamped.labels(exchange.replica, clamp.field).inc()
    log.warning(
        "replica %s reported implausible usage, clamped: %s",
        exchange.replica,
        ", ".join(clamp.describe() for clamp in clamped),
        extra={"replica": exchange.replica, "model": exchange.model},
    )


def record(scope: Scope, exchange: Exchange, metrics: GatewayMetrics) -> None:
    """The request's metrics and its one access line."""
    status = 499 if exchange.client_gone else exchange.status
    duration = time.perf_counter() - exchange.started
    overhead = exchange.overhead()
    metrics.requests.labels(exchange.model, exchange.replica, str(status)).inc()
    if exchange.kind:
        metrics.api_requests.labels(exchange.kind, str(status)).inc()
    if exchange.model:
        metrics.duration.labels(exchange.model).observe(duration)
        metrics.overhead.observe(overhead)
        if exchange.stream and exchange.ttft is not None:
            metrics.ttft.labels(exchange.model).observe(exchange.ttft)
        if exchange.usage is not None:
            _clamped(exchange, metrics)
            metrics.tokens.labels(exchange.model, "prompt").inc(exchange.usage.prompt_tokens)
            metrics.tokens.labels(exchange.model, "completion").inc(exchange.usage.completion_tokens)
            if exchange.usage.cached_tokens:
                metrics.cached_prompt_tokens.labels(exchange.model).inc(exchange.usage.cached_tokens)
        metrics.live.note(
            exchange.model,
            exchange.replica,
            status,
            exchange.ttft if exchange.stream else None,
            exchange.usage.completion_tokens if exchange.usage is not None else 0,
        )
    fields: dict[str, Any] = {
        "method": scope["method"],
        "path": scope["path"],
        "status": status,
        "duration_ms": round(duration * 1000, 2),
        "overhead_ms": round(overhead * 1000, 3),
    }
    if exchange.kind:
        fields["api"] = exchange.kind
    if exchange.model:
        fields.update(model=exchange.model, replica=exchange.replica, stream=exchange.stream)
    if exchange.ttft is not None:
        fields["ttft_ms"] = round(exchange.ttft * 1000, 2)
    if exchange.usage is not None:
        fields.update(
            prompt_tokens=exchange.usage.prompt_tokens,
            completion_tokens=exchange.usage.completion_tokens,
            cached_tokens=exchange.usage.cached_tokens,
        )
    if exchange.continuations:
        fields["continuations"] = exchange.continuations
    if exchange.client_gone:
        fields["client_gone"] = True
    # Health checks arrive every few seconds from load balancers: not worth a line each.
    quiet = scope["path"] == "/healthz" and status == 200
    access_log.log(logging.DEBUG if quiet else logging.INFO, "served", extra=fields)
