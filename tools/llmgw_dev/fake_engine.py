"""A fake OpenAI-compatible engine (llama.cpp-shaped) for fast tests, fault injection and load tests.

The gateway's tests need an upstream whose timing and failures they control, and that tells them
what it saw: which requests arrived with which headers, and whether a client went away mid-stream
(the proof that a gateway cancels its upstream request when its own client disconnects).

It is a bare ASGI application served by hypercorn's trio worker, without Quart: the fake shares a
core with the load generator during the benchmark, and Quart's 0.2-0.5 ms per request would be
spent there for nothing; a bare ASGI app also gives exact control over the two things the fake is
for -- noticing ``http.disconnect`` while streaming, and dropping a connection mid-body (returning
before the final body message makes hypercorn close the socket without the terminating chunk).

Use it in a trio test::

    async with run_fake_engine(FakeEngineBehavior(chunks=4)) as engine:
        ... engine.url, engine.behavior.chunk_delay = 0.1, await engine.observed.wait_disconnects(1)

or as a process (benchmarks)::

    python -m llmgw_dev.fake_engine --port 0 --chunks 32   # prints the URL when ready
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@attrs.define
class FakeEngineBehavior:
    """What the fake does. Mutable: a test may change it while the engine runs."""

    #: model ids served (``/v1/models``); a response echoes the requested model when it is one of
    #: them, otherwise the first (llama-server ignores the requested model the same way).
    models: list[str] = attrs.field(factory=lambda: ["fake-model"])
    #: content chunks (one per token) in a stream; also the completion length when not streaming.
    chunks: int = 8
    #: seconds before the response headers are sent.
    first_byte_delay: float = 0.0
    #: seconds between stream chunks.
    chunk_delay: float = 0.0
    #: ``usage.prompt_tokens``; ``usage.completion_tokens`` is ``completion_tokens`` or ``chunks``.
    prompt_tokens: int = 7
    completion_tokens: int | None = None
    #: the text of content chunk ``i`` is ``token_text.format(i=i)``.
    token_text: str = "tok{i} "
    embedding_dim: int = 8
    #: answer with this status and an OpenAI-shaped error instead of a result...
    status_before_body: int | None = None
    #: ...for this many requests only (then behave normally); None: for every request.
    status_times: int | None = None
    #: drop the connection (no terminating chunk, no ``[DONE]``) after this many content chunks.
    close_mid_stream_after: int | None = None
    #: never send the response headers.
    hang_before_first_byte: bool = False
    #: stop sending (but keep the connection open) after this many content chunks.
    hang_mid_stream_after: int | None = None
    #: require ``Authorization: Bearer <api_key>`` on everything but ``/health`` (401 otherwise).
    api_key: str | None = None
    #: send ``Connection: close`` after each streamed response, as llama-server effectively does.
    close_after_stream: bool = False


@attrs.frozen
class ObservedRequest:
    method: str
    path: str
    #: lower-cased header names; repeated headers keep the last value.
    headers: dict[str, str]
    json: Any
    request_id: str | None


@attrs.frozen
class ObservedDisconnect:
    path: str
    request_id: str | None
    #: "before_first_byte" (headers not sent yet) or "mid_stream".
    phase: str
    #: content chunks sent before the client went away.
    chunks_sent: int


@attrs.define
class FakeEngineObservations:
    """What the fake saw. Tests read the lists or await the counters."""

    requests: list[ObservedRequest] = attrs.field(factory=list)
    disconnects: list[ObservedDisconnect] = attrs.field(factory=list)
    completed_streams: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    #: set (and replaced) on every change, so waiters can re-check their condition.
    _changed: trio.Event = attrs.field(factory=trio.Event)
    #: totals for /metrics and load tests even when request recording is off.
    total_requests: int = 0
    prompt_tokens_total: int = 0
    tokens_predicted_total: int = 0
    #: keep ``requests``; the benchmark turns it off so memory stays flat.
    record: bool = True

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[FakeEngineObservations], bool]) -> None:
        """Wait until ``predicate(self)`` holds; bound it with a trio timeout scope."""
        while not predicate(self):
            await self._changed.wait()

    async def wait_disconnects(self, count: int = 1) -> list[ObservedDisconnect]:
        await self.wait_for(lambda o: len(o.disconnects) >= count)
        return self.disconnects

    async def wait_requests(self, count: int = 1) -> list[ObservedRequest]:
        await self.wait_for(lambda o: len(o.requests) >= count)
        return self.requests

    async def wait_in_flight(self, count: int) -> None:
        await self.wait_for(lambda o: o.in_flight >= count)


def _error_body(status: int, message: str) -> bytes:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            501: "not_supported_error", 503: "unavailable_error"}.get(status, "server_error")
    return _dumps({"error": {"code": status, "message": message, "type": kind}}).encode()


class _Disconnected(Exception):
    pass


class FakeEngineApp:
    """The ASGI application. One instance per running fake engine."""

    def __init__(self, behavior: FakeEngineBehavior, observed: FakeEngineObservations) -> None:
        self.behavior = behavior
        self.observed = observed
        self.closing = False
        self._ids = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        await self._http(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        obs = self.observed
        b = self.behavior
        obs.total_requests += 1

        if path == "/health" and method == "GET":
            await _respond(send, 200, b'{"status":"ok"}')
            return
        if b.api_key is not None and headers.get("authorization") != f"Bearer {b.api_key}":
            self._record(method, path, headers, None)
            await _respond(send, 401, _error_body(401, "Invalid API Key"))
            return
        parsed: Any = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                self._record(method, path, headers, None)
                # llama-server answers invalid JSON with a 500 and an OpenAI-shaped body.
                await _respond(send, 500, _error_body(500, "invalid JSON in request body"))
                return
        self._record(method, path, headers, parsed)

        if method == "GET" and path == "/v1/models":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "llmgw-fake"} for m in b.models]
            await _respond(send, 200, _dumps({"object": "list", "data": data}).encode())
            return
        if method == "GET" and path == "/metrics":
            await _respond(send, 200, self._metrics(), content_type=b"text/plain; version=0.0.4")
            return
        routes = {"/v1/chat/completions": "chat", "/v1/completions": "text", "/v1/embeddings": "embed"}
        kind = routes.get(path)
        if method != "POST" or kind is None:
            await _respond(send, 404, _error_body(404, f"no route for {method} {path}"))
            return
        if not isinstance(parsed, dict):
            await _respond(send, 400, _error_body(400, "the body must be a JSON object"))
            return

        request_id = headers.get("x-request-id")
        obs.in_flight += 1
        obs.max_in_flight = max(obs.max_in_flight, obs.in_flight)
        obs._notify()
        try:
            await self._serve(kind, path, request_id, parsed, receive, send)
        finally:
            obs.in_flight -= 1
            obs._notify()

    def _record(self, method: str, path: str, headers: dict[str, str], parsed: Any) -> None:
        if self.observed.record:
            self.observed.requests.append(
                ObservedRequest(method, path, headers, parsed, headers.get("x-request-id")))
            self.observed._notify()

    async def _serve(self, kind: str, path: str, request_id: str | None, req: dict[str, Any],
                     receive: Receive, send: Send) -> None:
        progress = {"started": False, "chunks": 0, "done": False}
        disconnected = False

        async def tracking_send(message: Message) -> None:
            # Once the last body message is handed over, hypercorn closes the stream and reports
            # http.disconnect even to a client that read everything: that is not a disconnect.
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                progress["done"] = True
            await send(message)

        async def watch_disconnect(cancel: trio.CancelScope) -> None:
            # hypercorn tells the app about a closed client only through receive(): wait for it
            # and cancel the response, so a hung or slow response notices at once.
            while (await receive())["type"] != "http.disconnect":
                pass
            nonlocal disconnected
            disconnected = True
            cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect, nursery.cancel_scope)
            try:
                await self._respond_to(kind, req, tracking_send, progress)
            finally:
                nursery.cancel_scope.cancel()
        if disconnected and not progress["done"] and not self.closing:
            phase = "mid_stream" if progress["started"] else "before_first_byte"
            self.observed.disconnects.append(
                ObservedDisconnect(path, request_id, phase, progress["chunks"]))
            self.observed._notify()

    async def _respond_to(self, kind: str, req: dict[str, Any], send: Send,
                          progress: dict[str, Any]) -> None:
        b = self.behavior
        if b.hang_before_first_byte:
            await trio.sleep_forever()
        if b.first_byte_delay:
            await trio.sleep(b.first_byte_delay)
        if b.status_before_body is not None and (b.status_times is None or b.status_times > 0):
            if b.status_times is not None:
                b.status_times -= 1
            status = b.status_before_body
            await _respond(send, status, _error_body(status, f"fake engine failure {status}"))
            return
        requested = req.get("model")
        model = requested if requested in b.models else (b.models[0] if b.models else "fake")
        self._ids += 1
        rid = f"fake-{self._ids}"
        created = int(time.time())
        n_completion = b.completion_tokens if b.completion_tokens is not None else b.chunks
        usage = {"prompt_tokens": b.prompt_tokens, "completion_tokens": n_completion,
                 "total_tokens": b.prompt_tokens + n_completion}
        self.observed.prompt_tokens_total += b.prompt_tokens

        if kind == "embed":
            inputs = req.get("input", "")
            items = inputs if isinstance(inputs, list) else [inputs]
            data = [{"object": "embedding", "index": i, "embedding": _embedding(str(x), b.embedding_dim)}
                    for i, x in enumerate(items)]
            await _respond(send, 200, _dumps({
                "object": "list", "model": model, "data": data,
                "usage": {"prompt_tokens": b.prompt_tokens, "total_tokens": b.prompt_tokens}}).encode())
            return

        if not req.get("stream"):
            text = "".join(b.token_text.format(i=i) for i in range(b.chunks))
            self.observed.tokens_predicted_total += n_completion
            if kind == "chat":
                choice: dict[str, Any] = {"index": 0, "finish_reason": "length",
                                          "message": {"role": "assistant", "content": text}}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "finish_reason": "length", "text": text, "logprobs": None}
                obj = "text_completion"
            await _respond(send, 200, _dumps({"id": rid, "object": obj, "created": created, "model": model,
                                              "choices": [choice], "usage": usage}).encode())
            return

        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        if b.close_after_stream:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        progress["started"] = True
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        head = f'{{"id":"{rid}","object":"{obj}","created":{created},"model":{_dumps(model)},"choices":'
        # Each event is one ASGI body message, as llama-server writes one event per token.
        if kind == "chat":
            await _event(send, head + '[{"index":0,"delta":{"role":"assistant","content":null},'
                         '"finish_reason":null}]}')
        for i in range(b.chunks):
            if b.close_mid_stream_after is not None and i >= b.close_mid_stream_after:
                return  # returning mid-body makes hypercorn close the connection: a truncated stream
            if b.hang_mid_stream_after is not None and i >= b.hang_mid_stream_after:
                await trio.sleep_forever()
            if b.chunk_delay:
                await trio.sleep(b.chunk_delay)
            piece = _dumps(b.token_text.format(i=i))
            if kind == "chat":
                event = f'{{"index":0,"delta":{{"content":{piece}}},"finish_reason":null}}'
            else:
                event = f'{{"index":0,"text":{piece},"logprobs":null,"finish_reason":null}}'
            await _event(send, f"{head}[{event}]}}")
            progress["chunks"] = i + 1
            self.observed.tokens_predicted_total += 1
        if kind == "chat":
            await _event(send, head + '[{"index":0,"delta":{},"finish_reason":"length"}]}')
            if include_usage:
                await _event(send, head + f'[],"usage":{_dumps(usage)}}}')
        else:
            # llama-server puts usage on the completions finish chunk even when not asked for.
            await _event(send, head + '[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}],'
                         f'"usage":{_dumps(usage)}}}')
        # Counted before the last write: a cancellation may land right after it (see tracking_send).
        self.observed.completed_streams += 1
        self.observed._notify()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    def _metrics(self) -> bytes:
        o = self.observed
        return (
            "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
            "# TYPE llamacpp:prompt_tokens_total counter\n"
            f"llamacpp:prompt_tokens_total {o.prompt_tokens_total}\n"
            "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
            "# TYPE llamacpp:tokens_predicted_total counter\n"
            f"llamacpp:tokens_predicted_total {o.tokens_predicted_total}\n"
            "# HELP llamacpp:requests_processing Number of requests processing.\n"
            "# TYPE llamacpp:requests_processing gauge\n"
            f"llamacpp:requests_processing {o.in_flight}\n"
            "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
            "# TYPE llamacpp:requests_deferred gauge\n"
            "llamacpp:requests_deferred 0\n"
        ).encode()


async def _respond(send: Send, status: int, body: bytes, *,
                   content_type: bytes = b"application/json") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _event(send: Send, data: str) -> None:
    await send({"type": "http.response.body", "body": b"data: " + data.encode() + b"\n\n", "more_body": True})


def _embedding(text: str, dim: int) -> list[float]:
    """Deterministic, unit-length, different for different texts."""
    seed = sum((i + 1) * c for i, c in enumerate(text.encode())) or 1
    raw = [math.sin(seed * (k + 1) * 0.618) for k in range(dim)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


@attrs.define
class FakeEngine:
    url: str
    port: int
    behavior: FakeEngineBehavior
    observed: FakeEngineObservations
    app: FakeEngineApp


def _hypercorn_config(host: str, port: int) -> Any:
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None  # a dropped connection is the point of some tests, not an error
    config.loglevel = "WARNING"
    # Long enough that a gateway's pooled connections are not closed under it between requests.
    config.keep_alive_timeout = 75.0
    config.keep_alive_max_requests = 1_000_000
    config.graceful_timeout = 0.0
    config.include_server_header = False
    config.include_date_header = False
    return config


@asynccontextmanager
async def run_fake_engine(behavior: FakeEngineBehavior | None = None, *, host: str = "127.0.0.1",
                          port: int = 0) -> AsyncIterator[FakeEngine]:
    """Serve a fake engine until the block exits; hanging responses are cancelled then."""
    from hypercorn.trio import serve

    behavior = behavior if behavior is not None else FakeEngineBehavior()
    observed = FakeEngineObservations()
    app = FakeEngineApp(behavior, observed)
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(_serve, serve, app, _hypercorn_config(host, port), shutdown)
        url = binds[0]
        engine = FakeEngine(url=url, port=int(url.rsplit(":", 1)[1]), behavior=behavior,
                            observed=observed, app=app)
        try:
            yield engine
        finally:
            # Cancelling handlers at shutdown is not a client disconnect: do not record them.
            app.closing = True
            shutdown.set()
            nursery.cancel_scope.cancel()


async def _serve(serve: Any, app: FakeEngineApp, config: Any, shutdown: trio.Event,
                 *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    await serve(app, config, shutdown_trigger=shutdown.wait, task_status=task_status)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Run a fake OpenAI-compatible engine; prints its URL when ready.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--model", action="append", dest="models", help="model id (repeatable)")
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--chunk-delay", type=float, default=0.0)
    p.add_argument("--first-byte-delay", type=float, default=0.0)
    p.add_argument("--prompt-tokens", type=int, default=7)
    p.add_argument("--api-key", default=None)
    p.add_argument("--close-after-stream", action="store_true")
    return p.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    behavior = FakeEngineBehavior(
        models=args.models or ["fake-model"], chunks=args.chunks, chunk_delay=args.chunk_delay,
        first_byte_delay=args.first_byte_delay, prompt_tokens=args.prompt_tokens, api_key=args.api_key,
        close_after_stream=args.close_after_stream)
    # hypercorn installs no signal handlers: without this SIGTERM would kill us without cleanup.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with run_fake_engine(behavior, host=args.host, port=args.port) as engine:
            engine.observed.record = False  # a long benchmark must not grow memory
            print(engine.url, flush=True)
            async for _ in signals:
                break


def main(argv: list[str] | None = None) -> int:
    trio.run(_main, parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
