"""The spans of one client request: the gateway's server span and its children.

``begin`` makes a ``RequestTrace`` when tracing is on (llmgw_shared/tracing.py) and the sampler
keeps the request, and an ``Unsampled`` when it does not (nothing recorded, the W3C context
still sent to the engine with its sampled flag clear); with tracing off every request shares
``UNTRACED``, whose methods do nothing and build nothing, so a daemon without a collector pays
one boolean per request.

The server span ``llmgw.request`` is the child of the client's W3C ``traceparent`` when it sent
a valid one; its ``tracestate``, when well formed and within W3C's bounds, rides along. Its
children: ``llmgw.admission`` (the key's quota check, waiting included),
``llmgw.queue`` (waiting for a replica slot or a replica to start), and one ``llmgw.attempt`` per
upstream attempt, whose outcome (gateway/attempts.py) is its ``llmgw.outcome`` attribute; the
attempt's context is what the engine receives as ``traceparent``. Attributes are the model,
profile key, replica, API, status and token counts, under the gen_ai semantic convention names
where there are some. Never a key, a header or prompt text, unless ``capture_prompts`` is set.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from llmgw_shared import tracing as shared_tracing

from .attempts import Answered, Broken, Outcome, Refused, Retry, Stalled

if TYPE_CHECKING:
    from .exchange import Exchange
    from .requests import ParsedRequest

_PROPAGATOR = TraceContextTextMapPropagator()
# A traceparent is 55 characters (version 00); anything longer is not W3C trace context and is
# ignored rather than parsed.
_MAX_TRACEPARENT = 64
# W3C asks every hop to pass on at least 512 characters of tracestate and at most 32 members; a
# longer or malformed one is dropped whole (the traceparent still counts), before the SDK's parser,
# which would log the client's text once per request.
_MAX_TRACESTATE = 512
_MAX_TRACESTATE_MEMBERS = 32
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
# The captured prompt (capture_prompts only): enough to recognise the request, never the whole
# document a client pasted.
_MAX_CAPTURED = 1024
# The gen_ai operation names of the routes that have one.
_OPERATIONS = {
    "chat": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
    "responses": "chat",
    "messages": "chat",
}
_OUTCOMES: dict[type[Outcome], str] = {
    Answered: "answered",
    Retry: "retry",
    Broken: "broken",
    Refused: "refused",
    Stalled: "stalled",
}


class RequestTrace:
    """A traced request's spans; the gateway calls these at its few steps."""

    def __init__(self, tracer: trace.Tracer, span: Span, capture_prompts: bool) -> None:
        self.tracer = tracer
        self.span = span
        self.context = trace.set_span_in_context(span)
        self.capture_prompts = capture_prompts
        self.attempts = 0

    def requested(self, request: ParsedRequest, profile_key: str) -> None:
        """What the client asked for: the model and the profile key it resolved to."""
        span = self.span
        span.set_attribute("gen_ai.request.model", request.model)
        span.set_attribute("llmgw.profile", profile_key)
        span.set_attribute("llmgw.stream", request.stream)
        if self.capture_prompts:
            payload = request.payload
            field = request.endpoint.messages or ("prompt" if "prompt" in payload else "input")
            text = json.dumps(payload.get(field), ensure_ascii=False)[:_MAX_CAPTURED]
            span.set_attribute("gen_ai.prompt", text)

    def phase(self, name: str) -> AbstractContextManager[Span]:
        return self._phase(name)

    @contextmanager
    def _phase(self, name: str) -> Iterator[Span]:
        """A child span for a wait (``llmgw.admission``, ``llmgw.queue``) around the block."""
        span = self.tracer.start_span(name, context=self.context)
        try:
            yield span
        finally:
            span.end()

    def attempt(self, replica: str, continuation: int, headers: list[tuple[str, str]]) -> Span:
        """Start an attempt's span and add its W3C context to the engine's ``headers``."""
        self.attempts += 1
        span = self.tracer.start_span(
            "llmgw.attempt",
            context=self.context,
            kind=SpanKind.CLIENT,
            attributes={"llmgw.replica": replica, "llmgw.attempt": self.attempts, "llmgw.continuation": continuation},
        )
        self.span.add_event("llmgw.replica_chosen", {"llmgw.replica": replica, "llmgw.attempt": self.attempts})
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        headers.extend(carrier.items())
        return span

    def attempted(self, span: Span, outcome: Outcome | None) -> None:
        """End an attempt's span with its outcome (None: it was cancelled or raised)."""
        if outcome is None:
            span.set_attribute("llmgw.outcome", "cancelled")
        else:
            span.set_attribute("llmgw.outcome", _OUTCOMES[type(outcome)])
            if isinstance(outcome, Retry | Broken):
                span.set_attribute("llmgw.reason", outcome.reason)
                span.set_status(Status(StatusCode.ERROR, outcome.error.code or "error"))
            elif isinstance(outcome, Refused):
                span.set_attribute("http.response.status_code", outcome.status)
            elif isinstance(outcome, Stalled):
                span.set_status(Status(StatusCode.ERROR, outcome.error.code or "error"))
        span.end()

    def end(self, exchange: Exchange) -> None:
        """The request's answer, on the server span, which ends."""
        span = self.span
        span.set_attribute("http.response.status_code", exchange.status)
        if exchange.model:
            span.set_attribute("llmgw.model", exchange.model)
        if exchange.replica:
            span.set_attribute("llmgw.replica", exchange.replica)
        if exchange.continuations:
            span.set_attribute("llmgw.continuations", exchange.continuations)
        if exchange.usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", exchange.usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", exchange.usage.completion_tokens)
        if exchange.client_gone:
            span.set_attribute("llmgw.client_gone", True)
        if exchange.status >= 500 or (exchange.status == 0 and not exchange.client_gone):
            span.set_status(Status(StatusCode.ERROR))
        span.end()


class Untraced(RequestTrace):
    """Tracing off: nothing is made, nothing is sent to the engine."""

    def __init__(self) -> None:
        self.span = trace.INVALID_SPAN

    def requested(self, request: ParsedRequest, profile_key: str) -> None:
        return None

    def phase(self, name: str) -> AbstractContextManager[Span]:
        # One shared context manager: no generator made per request.
        return _NO_PHASE

    def attempt(self, replica: str, continuation: int, headers: list[tuple[str, str]]) -> Span:
        return trace.INVALID_SPAN

    def attempted(self, span: Span, outcome: Outcome | None) -> None:
        return None

    def end(self, exchange: Exchange) -> None:
        return None


class Unsampled(Untraced):
    """Tracing on but the request not sampled: nothing is recorded, yet the engine still gets the
    W3C context (W3C trace context: a hop passes it on, sampled or not), so the trace id the
    client sent, its sampled flag (0) and its tracestate carry on past the gateway."""

    def __init__(self, span: Span) -> None:
        self.span = span
        # Made once: every attempt of the request sends the same context.
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        self.carrier = list(carrier.items())

    def attempt(self, replica: str, continuation: int, headers: list[tuple[str, str]]) -> Span:
        headers.extend(self.carrier)
        return trace.INVALID_SPAN


_NO_PHASE = nullcontext(trace.INVALID_SPAN)
UNTRACED = Untraced()


def valid_tracestate(value: str | None) -> str | None:
    """``value`` when it is a W3C tracestate within bounds, else None (dropped whole)."""
    if value is None or len(value) > _MAX_TRACESTATE:
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > _MAX_TRACESTATE_MEMBERS:
        return None
    if not all(_TRACESTATE_MEMBER.fullmatch(m) for m in members):
        return None
    if len({m.split("=", 1)[0] for m in members}) != len(members):
        return None  # a key twice is not W3C tracestate
    return value


def begin(
    tracing: shared_tracing.Tracing,
    traceparent: str | None,
    tracestate: str | None,
    path: str,
    kind: str,
    api: str,
    request_id: str,
) -> RequestTrace:
    """The request's trace, the child of the client's ``traceparent`` when it sent a valid one."""
    if not tracing.enabled:
        return UNTRACED
    carrier = {}
    if traceparent is not None and len(traceparent) <= _MAX_TRACEPARENT:
        carrier["traceparent"] = traceparent
        state = valid_tracestate(tracestate)
        if state is not None:
            carrier["tracestate"] = state
    parent = _PROPAGATOR.extract(carrier) if carrier else None
    attributes: dict[str, str] = {
        "http.request.method": "POST",
        "url.path": path,
        "llmgw.api": api,
        "llmgw.kind": kind,
        "llmgw.request_id": request_id,
    }
    if kind in _OPERATIONS:
        attributes["gen_ai.operation.name"] = _OPERATIONS[kind]
    span = tracing.tracer.start_span("llmgw.request", context=parent, kind=SpanKind.SERVER, attributes=attributes)
    if not span.is_recording():
        # Not sampled (the client's flags say so, or the ratio): the span records nothing but
        # holds the trace id, which the engine is sent as the SDK's propagator writes it.
        return Unsampled(span)
    return RequestTrace(tracing.tracer, span, tracing.capture_prompts)
