"""OpenTelemetry traces for both daemons: the ``[tracing]`` section, the SDK's tracer provider and
OTLP exporter, and a span processor that trio owns.

The SDK's ``BatchSpanProcessor`` starts a thread of its own; here ``TrioSpanProcessor.on_end``
only appends the finished span to a bounded deque (a full deque drops the span and counts it:
``llmgw_trace_spans_dropped_total``), and ``Tracing.run``, a task in the daemon's nursery, hands
batches to the SDK's exporter in the ``export`` thread pool (llmgw_shared/threads.py) within a
deadline. A collector that is down or hangs costs the data path nothing: requests never wait on
an export, and shutdown's last flush is bounded too.

Off (no ``endpoint``), ``current()`` is ``OFF``: its ``enabled`` is the one boolean the data path
checks, and ``span`` yields a non-recording span without building anything. The daemon's
``Tracing`` lives in a context variable set by ``open_tracing``, so every task the daemon starts
under it sees the same one (a test process runs a control and a node side by side, each its own).

About 350 lines: the config and its checks, the processor, the export loop and the helpers
(spans, events, and the traceparent a node command carries).
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .config import ConfigError
from .config_doc import doc
from .logs import get_logger
from .threads import EXPORT

log = get_logger(__name__)

PROTOCOLS = ("http/protobuf", "grpc")
# Spans sent to the collector in one request: the SDK's batch processor's default.
_BATCH = 512
# How often the export task looks for spans: a trace shows up within this, and a burst of
# requests is sent in a few large batches rather than one request each.
_EXPORT_EVERY = 1.0
# Beyond the exporter's own timeout, for the thread to return after its request gave up.
_SLACK = 1.0
# Shutdown's last flush and the exporter's close, together: a dead collector must not hold a
# daemon that was asked to stop.
_SHUTDOWN_BUDGET = 3.0
# An attribute value is cut to this many characters (the SDK's limit), whatever a client sent.
_MAX_ATTRIBUTE_LENGTH = 1024
_PROPAGATOR = TraceContextTextMapPropagator()
# A header name as HTTP and gRPC metadata take it (lower case for gRPC).
_HEADER_NAME = re.compile(r"^[a-z0-9][a-z0-9_.\-]{0,63}$")


@attrs.frozen
class TracingConfig:
    endpoint: str = attrs.field(
        default="",
        metadata=doc(
            "The OTLP collector: http://collector:4318 or its full http://collector:4318/v1/traces (http/protobuf), "
            "or http://collector:4317 (grpc); empty: tracing off."
        ),
    )
    protocol: str = attrs.field(default="http/protobuf", metadata=doc("http/protobuf or grpc."))
    sample_ratio: float = attrs.field(
        default=1.0,
        metadata=doc(
            "Share of new traces recorded, 0 to 1; a request whose traceparent says sampled follows its caller."
        ),
    )
    service_name: str = attrs.field(
        default="", metadata=doc("service.name of the spans (empty: llmgw-control or llmgw-node).")
    )
    headers: dict[str, str] = attrs.field(
        factory=dict,
        repr=False,
        metadata=doc("Headers sent with every export, e.g. the collector's API key; never logged."),
    )
    capture_prompts: bool = attrs.field(
        default=False,
        metadata=doc(
            "Put the request's messages or prompt (cut to 1 KiB) in the gateway's span: prompt text then "
            "leaves for the collector (docs/security.md)."
        ),
    )
    export_timeout: float = attrs.field(
        default=5.0, metadata=doc("Seconds one export may take before its batch is given up.")
    )
    queue_size: int = attrs.field(
        default=4096,
        metadata=doc("Finished spans kept for export; more are dropped and counted (llmgw_trace_spans_dropped_total)."),
    )


def validate_tracing(config: TracingConfig) -> TracingConfig:
    """Refuse what the exporter would only fail on later; the endpoint is returned as is."""
    if not config.endpoint:
        return config
    parts = urlsplit(config.endpoint)
    try:
        parts.port  # noqa: B018 -- urlsplit validates the port lazily
    except ValueError:
        raise ConfigError(f"tracing.endpoint: {config.endpoint!r} has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(
            f"tracing.endpoint: {config.endpoint!r} is not an http(s) URL with a host, "
            "e.g. http://collector:4318/v1/traces"
        )
    if config.protocol not in PROTOCOLS:
        raise ConfigError(f"tracing.protocol must be one of {', '.join(PROTOCOLS)}, got {config.protocol!r}")
    if not 0.0 <= config.sample_ratio <= 1.0:
        raise ConfigError(f"tracing.sample_ratio must be between 0 and 1, got {config.sample_ratio}")
    if not 0 < config.export_timeout <= 60:
        raise ConfigError(f"tracing.export_timeout must be more than 0 and at most 60, got {config.export_timeout}")
    if not 1 <= config.queue_size <= 1_000_000:
        raise ConfigError(f"tracing.queue_size must be between 1 and 1000000, got {config.queue_size}")
    for name, value in config.headers.items():
        # The value is a secret: only its name is ever shown.
        if not _HEADER_NAME.fullmatch(name):
            raise ConfigError(f"tracing.headers: {name[:64]!r} is not a lower-case header name")
        if any(c in value for c in "\r\n\0") or len(value) > 8192:
            raise ConfigError(f"tracing.headers.{name}: the value has a line break or is over 8 KiB")
    return config


class TrioSpanProcessor(SpanProcessor):
    """Finished, sampled spans kept for the export task; never blocks and never starts a thread."""

    def __init__(self, limit: int) -> None:
        self.spans: deque[ReadableSpan] = deque()
        self.limit = limit
        self.dropped = 0
        self.exported = 0
        # Spans in batches the collector refused or did not answer in time.
        self.failed = 0

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if len(self.spans) >= self.limit:
            self.dropped += 1
            return
        self.spans.append(span)

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        # Flushing is the export task's (Tracing.flush); nothing waits here.
        return True


class Tracing:
    """One daemon's tracer and export task; ``OFF`` when no collector is configured."""

    def __init__(
        self,
        provider: TracerProvider | None = None,
        exporter: SpanExporter | None = None,
        config: TracingConfig | None = None,
    ) -> None:
        self.enabled = provider is not None
        self.provider = provider
        self.exporter = exporter
        self.config = config or TracingConfig()
        self.capture_prompts = self.config.capture_prompts
        self.processor = TrioSpanProcessor(self.config.queue_size)
        self.tracer: trace.Tracer = provider.get_tracer("llmgw") if provider else trace.NoOpTracer()
        self._failing_since: float | None = None
        if provider is not None:
            provider.add_span_processor(self.processor)

    async def run(self) -> None:
        """Export what finished, every ``_EXPORT_EVERY`` seconds, until cancelled."""
        if not self.enabled:
            return
        while True:
            await trio.sleep(_EXPORT_EVERY)
            await self.flush()

    async def flush(self) -> None:
        """Send every span kept so far; a batch that fails or times out is dropped (and counted)."""
        spans = self.processor.spans
        while spans and self.exporter is not None:
            batch = [spans.popleft() for _ in range(min(_BATCH, len(spans)))]
            result = SpanExportResult.FAILURE
            with trio.move_on_after(self.config.export_timeout + _SLACK):
                try:
                    result = await EXPORT.run(self.exporter.export, batch, abandon=True)
                except Exception as exc:
                    log.warning("trace export failed: %s", type(exc).__name__)
            if result is not SpanExportResult.SUCCESS:
                self.processor.failed += len(batch)
                self._failed()
                return  # the next look tries again; meanwhile spans wait or are dropped
            self.processor.exported += len(batch)
            self._failing_since = None

    def _failed(self) -> None:
        # Said once per outage, not once per batch: a collector that is down for an hour would
        # otherwise fill the log.
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.warning(
                "traces cannot be exported to %s; spans are dropped until it answers",
                urlsplit(self.config.endpoint).netloc,
            )

    async def aclose(self) -> None:
        """The last flush and the exporter's close, within ``_SHUTDOWN_BUDGET`` seconds."""
        if self.provider is None or self.exporter is None:
            return
        with trio.move_on_after(_SHUTDOWN_BUDGET):
            await self.flush()
            await EXPORT.run(self.exporter.shutdown, abandon=True)
        self.provider.shutdown()


OFF = Tracing()
_CURRENT: ContextVar[Tracing] = ContextVar("llmgw.tracing", default=OFF)


def current() -> Tracing:
    """The daemon's tracing (``OFF`` outside ``open_tracing``)."""
    return _CURRENT.get()


@contextmanager
def use(tracing: Tracing) -> Iterator[Tracing]:
    """Make ``tracing`` the current one for this task and the tasks it starts."""
    token = _CURRENT.set(tracing)
    try:
        yield tracing
    finally:
        _CURRENT.reset(token)


def make_exporter(config: TracingConfig) -> SpanExporter:
    """The SDK's OTLP exporter for ``config.protocol``."""
    headers = dict(config.headers)
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(
            endpoint=config.endpoint,
            insecure=config.endpoint.startswith("http://"),
            headers=headers,
            timeout=config.export_timeout,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=http_traces_url(config.endpoint), headers=headers, timeout=config.export_timeout)


# Where OTLP/HTTP takes traces on a collector given by its base URL (the OTLP specification's
# signal path, which the SDK itself appends to OTEL_EXPORTER_OTLP_ENDPOINT).
TRACES_PATH = "/v1/traces"


def http_traces_url(endpoint: str) -> str:
    """``endpoint`` as the OTLP/HTTP traces URL: a collector's base URL (``http://host:4318``, no
    path) gets the signal path, as the SDK does for its environment variable; a URL with a path is
    the operator's exact choice and kept."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return parts._replace(path=TRACES_PATH).geturl()
    return endpoint


def make_tracing(config: TracingConfig, service: str, exporter: SpanExporter | None = None) -> Tracing:
    """A ``Tracing`` for ``config`` (``OFF`` without an endpoint); ``exporter`` replaces the OTLP one."""
    if not config.endpoint and exporter is None:
        return OFF
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
        resource=Resource.create({"service.name": config.service_name or service}),
        span_limits=SpanLimits(max_attribute_length=_MAX_ATTRIBUTE_LENGTH),
        # The SDK's own exit hook would flush from a thread at interpreter exit; aclose does it.
        shutdown_on_exit=False,
    )
    return Tracing(provider, exporter or make_exporter(config), config)


@asynccontextmanager
async def open_tracing(config: TracingConfig, service: str) -> AsyncIterator[Tracing]:
    """The daemon's tracing, current for the block, its export task running; flushed on exit."""
    tracing = make_tracing(config, service)
    if not tracing.enabled:
        yield tracing
        return
    with use(tracing):
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tracing.run)
                try:
                    yield tracing
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await tracing.aclose()


@contextmanager
def span(name: str, attributes: Mapping[str, str | int | float | bool] | None = None) -> Iterator[trace.Span]:
    """A span of the daemon's own work (a reconcile pass, an install), current for the block."""
    tracing = _CURRENT.get()
    if not tracing.enabled:
        yield trace.INVALID_SPAN
        return
    with tracing.tracer.start_as_current_span(name, attributes=attributes) as current_span:
        yield current_span


def event(name: str, attributes: Mapping[str, str | int | float | bool]) -> None:
    """An event on the current span of the daemon's own work (nothing when tracing is off)."""
    if _CURRENT.get().enabled:
        trace.get_current_span().add_event(name, attributes)


def traceparent() -> str:
    """The W3C traceparent of the current span, for a command sent to a node ("" when off)."""
    if not _CURRENT.get().enabled:
        return ""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


@contextmanager
def remote_parent(parent: str) -> Iterator[None]:
    """Spans begun in the block, and in the tasks it starts, are children of ``parent``, the
    traceparent control's command carried (wire.py checked its form); nothing when "" or off."""
    if not parent or not _CURRENT.get().enabled:
        yield
        return
    token = otel_context.attach(_PROPAGATOR.extract({"traceparent": parent}))
    try:
        yield
    finally:
        otel_context.detach(token)
