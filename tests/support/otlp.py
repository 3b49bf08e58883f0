"""Minimal OTLP trace receivers on 127.0.0.1 for the tracing tests: what a collector would get.

The OpenTelemetry Collector is not on PyPI, so the tests receive the exporters' real requests
here and decode them with the official ``opentelemetry-proto`` package: ``HttpReceiver`` (OTLP/HTTP,
``POST /v1/traces``, a trio server speaking h11) and ``GrpcReceiver`` (OTLP/gRPC, grpcio's server
with the proto package's ``TraceServiceServicer``). Both keep every span as a ``Received`` span;
``hang = True`` makes them take requests and never answer (a collector that is stuck).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import attrs
import grpc
import h11
import trio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from support.h11_request import read_request
from support.waiting import wait_until


@attrs.frozen
class Received:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which is not None else None


def decode(body: bytes) -> list[Received]:
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    return spans_of(request)


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Received]:
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    Received(
                        name=span.name,
                        service=str(resource.get("service.name", "")),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        events=[(e.name, {a.key: _value(a.value) for a in e.attributes}) for e in span.events],
                        status_code=span.status.code,
                    )
                )
    return out


class _Spans:
    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.requests = 0
        self.headers: list[dict[str, str]] = []
        self.hang = False
        self._lock = threading.Lock()

    def add(self, spans: list[Received], headers: dict[str, str]) -> None:
        with self._lock:
            self.spans.extend(spans)
            self.requests += 1
            self.headers.append(headers)

    def named(self, name: str) -> list[Received]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    async def wait_for(self, check: Callable[[list[Received]], bool], timeout: float = 10.0) -> list[Received]:
        def snapshot() -> list[Received]:
            with self._lock:
                return list(self.spans)

        async def done() -> bool:
            return check(snapshot())

        await wait_until(done, timeout=timeout)
        return snapshot()


class HttpReceiver(_Spans):
    url = ""

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/traces"
        task_status.started(self.url)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        async with stream:
            while True:
                read = await read_request(connection, stream)
                if read is None:
                    return
                head, body = read
                if self.hang:
                    await trio.sleep_forever()
                headers = {k.decode(): v.decode() for k, v in head.headers}
                # A collector takes traces on OTLP's signal path alone, as the Collector does.
                found = head.target.split(b"?")[0] == b"/v1/traces"
                if found:
                    self.add(decode(body), headers)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString() if found else b""
                await stream.send_all(
                    connection.send(
                        h11.Response(
                            status_code=200 if found else 404,
                            headers=[("content-type", "application/x-protobuf"), ("content-length", str(len(answer)))],
                        )
                    )
                    or b""
                )
                await stream.send_all(connection.send(h11.Data(data=answer)) or b"")
                await stream.send_all(connection.send(h11.EndOfMessage()) or b"")
                if connection.our_state is not h11.DONE:
                    return
                connection.start_next_cycle()


@asynccontextmanager
async def http_receiver() -> AsyncIterator[HttpReceiver]:
    receiver = HttpReceiver()
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        yield receiver
        nursery.cancel_scope.cancel()


class GrpcReceiver(_Spans, trace_service_pb2_grpc.TraceServiceServicer):
    url = ""

    def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.ServicerContext,
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        if self.hang:
            threading.Event().wait(30)
        self.add(spans_of(request), {k: v for k, v in context.invocation_metadata()})  # type: ignore[misc]
        return trace_service_pb2.ExportTraceServiceResponse()


@contextmanager
def grpc_receiver() -> Iterator[GrpcReceiver]:
    receiver = GrpcReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    receiver.url = f"http://127.0.0.1:{port}"
    try:
        yield receiver
    finally:
        server.stop(grace=None)
