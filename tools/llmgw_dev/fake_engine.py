"""A fake OpenAI-compatible engine (llama.cpp-shaped) for fast tests, fault injection and load tests.

The gateway's tests need an upstream whose timing and failures they control, and that tells them
what it saw: which requests arrived with which headers, and whether a client went away mid-stream
(the proof that a gateway cancels its upstream request when its own client disconnects).

It is an ASGI-shaped application served by a small trio + h11 server in this file, not by
hypercorn (+ Quart). The reason is measured, not taste: in the benchmark the fake shares core 0
with the load generator, and under hypercorn it cost 1.45 ms CPU per JSON answer and ~5 ms per
32-chunk stream (hypercorn's per-message machinery, ~0.13 ms per SSE event) -- as much as the
gateway's whole budget, so core 0 ran out before the gateway's core did and the throughput
ratios measured the fake. The small server also gives exact control over what the fake is for:
noticing a client that went away (reported to the app as ``http.disconnect``), and dropping a
connection mid-body (an app that returns before its last body message gets its socket closed
without the terminating chunk). The app stays plain ASGI, so hypercorn can still serve it.

Use it in a trio test::

    async with run_fake_engine(FakeEngineBehavior(chunks=4)) as engine:
        ... engine.url, engine.behavior.chunk_delay = 0.1, await engine.observed.wait_disconnects(1)

or as a process (benchmarks)::

    python -m llmgw_dev.fake_engine --port 0 --chunks 32   # prints the URL when ready

About 790 lines: every fault a test or a bench can ask of an engine lives in this one fake, so each
behaves the same way wherever it is used.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from functools import partial
from http import HTTPStatus
from typing import Any

import attrs
import h11
import trio

from llmgw_dev.fake_lora import PATHS as LORA_PATHS
from llmgw_dev.fake_lora import FakeLoras

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
    #: drop the connection after this many bytes of a stream's body, mid-event if it falls there.
    cut_after_bytes: int | None = None
    #: the mid-stream faults (close, cut, hang) strike this many streams only (then streams run
    #: whole); None: every stream. Shared by two fakes, the first stream dies wherever it went.
    stream_fault_times: int | None = None
    #: never send the response headers.
    hang_before_first_byte: bool = False
    #: stop sending (but keep the connection open) after this many content chunks.
    hang_mid_stream_after: int | None = None
    #: require ``Authorization: Bearer <api_key>`` on everything but ``/health`` (401 otherwise).
    api_key: str | None = None
    #: send ``Connection: close`` after each streamed response, as llama-server effectively does.
    close_after_stream: bool = False
    #: whose Prometheus series ``/metrics`` speaks: "llama.cpp", "vllm" or "sglang"
    #: (``llmgw_dev.fake_served_engine`` runs the fake behind vLLM's and SGLang's command lines).
    metrics_as: str = "llama.cpp"
    #: generate at most this many responses at once, the rest wait their turn before any byte
    #: (llama-server's ``-np`` slots): a fake that saturates at a known concurrency, where time
    #: to first token jumps by a whole response's time. None: no limit.
    saturate_at: int | None = None
    #: close keep-alive connections at random, as engines do when their idle timeout fires: after
    #: an answer (at once, or a moment later while the client may be taking the connection), or
    #: as the next request arrives on a connection that has served before, unanswered. Each with
    #: this probability; a connection's first request is always answered.
    keepalive_close_rate: float = 0.0
    #: the seed of those draws, so a failing run can be run again.
    keepalive_close_seed: int = 0
    #: vLLM's run-time LoRA adapters (``fake_lora.py``), when started with ``--enable-lora``.
    loras: FakeLoras | None = None


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
    #: keep-alive connections closed by ``keepalive_close_rate``.
    keepalive_closes: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    #: TCP connections accepted so far: shows whether a client (a gateway's pool) reuses them.
    connections: int = 0
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
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        501: "not_supported_error",
        503: "unavailable_error",
    }.get(status, "server_error")
    return _dumps({"error": {"code": status, "message": message, "type": kind}}).encode()


class FakeEngineApp:
    """The ASGI application. One instance per running fake engine."""

    def __init__(self, behavior: FakeEngineBehavior, observed: FakeEngineObservations) -> None:
        self.behavior = behavior
        self.observed = observed
        self.closing = False
        self._ids = 0
        self._slots: tuple[int, trio.Semaphore] | None = None

    def _generation_slots(self) -> trio.Semaphore | None:
        limit = self.behavior.saturate_at
        if limit is None:
            return None
        if self._slots is None or self._slots[0] != limit:
            self._slots = (limit, trio.Semaphore(limit))
        return self._slots[1]

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

        if method == "POST" and path in LORA_PATHS and b.loras is not None:
            status, text = b.loras.handle(path, parsed)
            await _respond(
                send,
                status,
                text.encode() if status == 200 else _error_body(status, text),
                content_type=b"text/plain" if status == 200 else b"application/json",
            )
            return
        if method == "GET" and path == "/v1/models":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "llmgw-fake"} for m in b.models]
            # vLLM lists its loaded adapters as models of their own, with the base as parent and
            # the directory it was loaded from as root.
            data += [
                {
                    "id": n,
                    "object": "model",
                    "created": 0,
                    "owned_by": "llmgw-fake",
                    "root": path,
                    "parent": b.models[0] if b.models else "",
                }
                for n, path in (b.loras.loaded if b.loras else {}).items()
            ]
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
            self.observed.requests.append(ObservedRequest(method, path, headers, parsed, headers.get("x-request-id")))
            self.observed._notify()

    async def _serve(
        self, kind: str, path: str, request_id: str | None, req: dict[str, Any], receive: Receive, send: Send
    ) -> None:
        progress = {"started": False, "chunks": 0, "done": False}
        disconnected = False

        async def tracking_send(message: Message) -> None:
            # Once the last body message is handed over, a server may report http.disconnect (the
            # client closing a finished connection, hypercorn closing the stream): not a disconnect.
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                progress["done"] = True
            await send(message)

        async def watch_disconnect(cancel: trio.CancelScope) -> None:
            # ASGI tells the app about a closed client only through receive(): wait for it and
            # cancel the response, so a hung or slow response notices at once.
            while (await receive())["type"] != "http.disconnect":
                pass
            nonlocal disconnected
            disconnected = True
            cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect, nursery.cancel_scope)
            try:
                slots = self._generation_slots()
                if slots is None:
                    await self._respond_to(kind, req, tracking_send, progress)
                else:
                    async with slots:
                        await self._respond_to(kind, req, tracking_send, progress)
            finally:
                nursery.cancel_scope.cancel()
        if disconnected and not progress["done"] and not self.closing:
            phase = "mid_stream" if progress["started"] else "before_first_byte"
            self.observed.disconnects.append(ObservedDisconnect(path, request_id, phase, progress["chunks"]))
            self.observed._notify()

    async def _failed_first(self, send: Send) -> bool:
        """The behaviours before any answer: a hang, a delay, an error status (True: it answered)."""
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
            return True
        return False

    async def _respond_to(self, kind: str, req: dict[str, Any], send: Send, progress: dict[str, Any]) -> None:
        b = self.behavior
        if await self._failed_first(send):
            return
        requested = req.get("model")
        adapter = requested if b.loras is not None and requested in b.loras.loaded else None
        if b.loras is not None and adapter is None and requested not in b.models:
            await _respond(send, 404, _error_body(404, f"The model `{requested}` does not exist."))
            return
        model = adapter or (requested if requested in b.models else (b.models[0] if b.models else "fake"))
        self._ids += 1
        rid = f"fake-{self._ids}"
        created = int(time.time())
        n_completion = b.completion_tokens if b.completion_tokens is not None else b.chunks
        usage = {
            "prompt_tokens": b.prompt_tokens,
            "completion_tokens": n_completion,
            "total_tokens": b.prompt_tokens + n_completion,
        }
        self.observed.prompt_tokens_total += b.prompt_tokens

        if kind == "embed":
            inputs = req.get("input", "")
            items = inputs if isinstance(inputs, list) else [inputs]
            data = [
                {"object": "embedding", "index": i, "embedding": _embedding(str(x), b.embedding_dim)}
                for i, x in enumerate(items)
            ]
            await _respond(
                send,
                200,
                _dumps(
                    {
                        "object": "list",
                        "model": model,
                        "data": data,
                        "usage": {"prompt_tokens": b.prompt_tokens, "total_tokens": b.prompt_tokens},
                    }
                ).encode(),
            )
            return

        if not req.get("stream"):
            # An adapter's "effect": its answers say which adapter made them.
            text = "".join(b.token_text.format(i=i) for i in range(b.chunks))
            text = f"[lora:{adapter}] {text}" if adapter else text
            self.observed.tokens_predicted_total += n_completion
            if kind == "chat":
                choice: dict[str, Any] = {
                    "index": 0,
                    "finish_reason": "length",
                    "message": {"role": "assistant", "content": text},
                }
                obj = "chat.completion"
            else:
                choice = {"index": 0, "finish_reason": "length", "text": text, "logprobs": None}
                obj = "text_completion"
            await _respond(
                send,
                200,
                _dumps(
                    {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": usage}
                ).encode(),
            )
            return

        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        if b.close_after_stream:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        progress["started"] = True
        faulty = b.stream_fault_times is None or b.stream_fault_times > 0
        if b.stream_fault_times and faulty:
            b.stream_fault_times -= 1
        if b.cut_after_bytes is not None and faulty:
            send = _cutting(send, b.cut_after_bytes)
        # Like llama-server, a trailing assistant message is continued (a prefill) and echoed in
        # the first delta; the fake's "model" resumes its sequence after the tokens the prefill
        # (or a completions prompt) already ends with, so a continued stream is the whole one.
        prefill = _prefill(kind, req)
        start = _resumed_at(prefill or (req.get("prompt") if kind != "chat" else None), b.token_text, b.chunks)
        echo = prefill or ""
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        head = f'{{"id":"{rid}","object":"{obj}","created":{created},"model":{_dumps(model)},"choices":'
        if start:
            # The prompt the engine read holds the resumed tokens; it generates the rest.
            generated = max(0, n_completion - start)
            usage = {
                "prompt_tokens": b.prompt_tokens + start,
                "completion_tokens": generated,
                "total_tokens": b.prompt_tokens + start + generated,
            }
        try:
            await self._stream(kind, send, head, (start, echo, faulty), include_usage, usage, progress)
        except _Cut:
            return  # the connection drops mid-body: a truncated stream

    async def _stream(
        self,
        kind: str,
        send: Send,
        head: str,
        resume: tuple[int, str, bool],
        include_usage: bool,
        usage: dict[str, Any],
        progress: dict[str, Any],
    ) -> None:
        b = self.behavior
        start, echo, faulty = resume
        # Each event is one ASGI body message, as llama-server writes one event per token.
        if kind == "chat":
            await _event(send, head + '[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}')
        for i in range(start, b.chunks):
            if faulty and b.close_mid_stream_after is not None and i - start >= b.close_mid_stream_after:
                return  # returning mid-body makes the server drop the connection: a truncated stream
            if faulty and b.hang_mid_stream_after is not None and i - start >= b.hang_mid_stream_after:
                await trio.sleep_forever()
            if b.chunk_delay:
                await trio.sleep(b.chunk_delay)
            piece = _dumps(echo + b.token_text.format(i=i))
            echo = ""
            if kind == "chat":
                event = f'{{"index":0,"delta":{{"content":{piece}}},"finish_reason":null}}'
            else:
                event = f'{{"index":0,"text":{piece},"logprobs":null,"finish_reason":null}}'
            await _event(send, f"{head}[{event}]}}")
            progress["chunks"] = i - start + 1
            self.observed.tokens_predicted_total += 1
        if kind == "chat":
            await _event(send, head + '[{"index":0,"delta":{},"finish_reason":"length"}]}')
            if include_usage:
                await _event(send, head + f'[],"usage":{_dumps(usage)}}}')
        else:
            # llama-server puts usage on the completions finish chunk even when not asked for.
            await _event(
                send,
                head + f'[{{"index":0,"text":"","logprobs":null,"finish_reason":"length"}}],"usage":{_dumps(usage)}}}',
            )
        # Counted before the last write: a cancellation may land right after it (see tracking_send).
        self.observed.completed_streams += 1
        self.observed._notify()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    def _metrics(self) -> bytes:
        o = self.observed
        model = self.behavior.models[0] if self.behavior.models else ""
        if self.behavior.metrics_as == "vllm":
            # vLLM's gauges carry the served name (and, from 0.8, the engine core) as labels.
            return (
                "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{engine="0",model_name="{model}"}} {float(o.in_flight)}\n'
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} 0.0\n'
                "# TYPE vllm:prompt_tokens_total counter\n"
                f'vllm:prompt_tokens_total{{engine="0",model_name="{model}"}} {float(o.prompt_tokens_total)}\n'
            ).encode()
        if self.behavior.metrics_as == "sglang":
            return (
                "# HELP sglang:num_running_reqs The number of running requests.\n"
                "# TYPE sglang:num_running_reqs gauge\n"
                f'sglang:num_running_reqs{{model_name="{model}"}} {float(o.in_flight)}\n'
                "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
                "# TYPE sglang:num_queue_reqs gauge\n"
                f'sglang:num_queue_reqs{{model_name="{model}"}} 0.0\n'
            ).encode()
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


async def _respond(send: Send, status: int, body: bytes, *, content_type: bytes = b"application/json") -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Cut(Exception):
    """The stream's byte budget (``cut_after_bytes``) is spent: the connection is to drop."""


def _cutting(send: Send, budget: int) -> Send:
    """``send`` that passes ``budget`` bytes of body, then raises _Cut (mid-event if it falls there)."""
    left = budget

    async def cut_send(message: Message) -> None:
        nonlocal left
        body = message.get("body", b"")
        if len(body) >= left and (body or left == 0):
            if left:
                await send({**message, "body": body[:left], "more_body": True})
            raise _Cut()
        left -= len(body)
        await send(message)

    return cut_send


def _prefill(kind: str, req: dict[str, Any]) -> str | None:
    """The content of a trailing assistant message in a chat request, which llama-server continues."""
    messages = req.get("messages")
    if kind != "chat" or not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str):
        return str(last["content"])
    return None


def _resumed_at(text: Any, token_text: str, chunks: int) -> int:
    """How many of the fake's tokens (0, 1, ...) ``text`` already ends with, in order."""
    if not isinstance(text, str):
        return 0
    best, joined = 0, ""
    for k in range(1, chunks + 1):
        joined += token_text.format(i=k - 1)
        if len(joined) > len(text):
            break
        if text.endswith(joined):
            best = k
    return best


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


async def _serve_connection(app: FakeEngineApp, stream: trio.SocketStream) -> None:
    """One HTTP/1.1 connection: requests one after another (keep-alive), each handed to the ASGI app.

    A deliberately small server: no pipelining beyond what h11 buffers, no request timeouts (the
    owner's nursery ends everything), no TLS. What it must get right is what the fake is for:
    a client that goes away is reported to the app as ``http.disconnect`` at once, and an app that
    returns before its last body message gets its connection dropped, terminating chunk unsent.
    """
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    app.observed.connections += 1
    conn = h11.Connection(h11.SERVER)
    rate = app.behavior.keepalive_close_rate
    draws = random.Random(app.behavior.keepalive_close_seed * 1_000_003 + app.observed.connections)
    served = 0
    async with stream:
        while True:
            event = await _next_event(conn, stream)
            if not isinstance(event, h11.Request):
                return  # closed by the client, or garbage
            if served and rate and draws.random() < rate:
                app.observed.keepalive_closes += 1
                return  # the idle timeout fired as this request arrived: closed, unanswered
            if conn.they_are_waiting_for_100_continue:
                # curl asks this for bodies over 1 KB and would otherwise wait a second.
                await stream.send_all(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
            body = b""
            while True:
                part = await _next_event(conn, stream)
                if isinstance(part, h11.Data):
                    body += part.data
                elif isinstance(part, h11.EndOfMessage):
                    break
                else:
                    return
            if not await _run_app(app, conn, stream, event, body):
                return
            served += 1
            if rate and draws.random() < rate:
                app.observed.keepalive_closes += 1
                await trio.sleep(draws.choice((0.0, draws.uniform(0, 0.003))))
                return
            # The response bypassed h11 (see _run_app): start a fresh parser on what is buffered.
            leftover, closed = conn.trailing_data
            if closed:
                return
            conn = h11.Connection(h11.SERVER)
            if leftover:  # (receive_data(b"") would mean end of input)
                conn.receive_data(leftover)


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> Any:
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return None
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None
        conn.receive_data(data)


class _AsgiChannel:
    """One request's ASGI ``receive`` and ``send`` over the connection, the response framed here.

    Responses are framed here rather than by h11: h11 runs every body chunk through its state
    machine, ~15 us per SSE event, which on a 32-chunk stream was a fifth of the fake's CPU.
    """

    __slots__ = (
        "body",
        "chunked",
        "close",
        "conn",
        "delivered_body",
        "disconnected",
        "done",
        "keep_alive",
        "started",
        "stream",
    )

    def __init__(self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes) -> None:
        self.conn, self.stream, self.body = conn, stream, body
        self.disconnected = trio.Event()
        self.delivered_body = False
        self.started = self.chunked = self.close = self.done = False
        self.keep_alive = request.http_version == b"1.1" and not any(
            k == b"connection" and v.lower() == b"close" for k, v in request.headers
        )

    async def receive(self) -> Message:
        if not self.delivered_body:
            self.delivered_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.disconnected.is_set() or self.done:
            return  # like hypercorn: writes after a disconnect go nowhere
        if message["type"] == "http.response.start" and not self.started:
            out = self._head(message)
        elif message["type"] == "http.response.body" and self.started:
            data = bytes(message.get("body", b""))
            out = (b"%x\r\n%s\r\n" % (len(data), data) if data else b"") if self.chunked else data
            if not message.get("more_body", False):
                self.done = True
                if self.chunked:
                    out += b"0\r\n\r\n"
        else:
            return
        try:
            await self.stream.send_all(out)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.disconnected.set()

    def _head(self, message: Message) -> bytes:
        self.started = True
        headers: list[tuple[bytes, bytes]] = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", [])]
        names = {k for k, _ in headers}
        self.chunked = b"content-length" not in names
        self.close = (b"connection", b"close") in headers or not self.keep_alive
        status = int(message["status"])
        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b""
        out = b"HTTP/1.1 %d %s\r\n" % (status, reason)
        out += b"".join(k + b": " + v + b"\r\n" for k, v in headers)
        if self.chunked:
            out += b"transfer-encoding: chunked\r\n"
        if self.close and b"connection" not in names:
            out += b"connection: close\r\n"
        return out + b"\r\n"

    async def watch(self) -> None:
        # The only way to notice a client that left while we are silent (hanging, or between
        # chunks) is to keep reading: EOF or a reset means it is gone.
        while True:
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self.disconnected.set()
                return
            self.conn.receive_data(data)  # a pipelined next request: h11 keeps it for the next cycle


async def _run_app(
    app: FakeEngineApp, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
) -> bool:
    """Run the app for one request; False when the connection must not be reused."""
    target = request.target.decode("latin-1")
    path, _, query = target.partition("?")
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method.decode("ascii"),
        "path": path,
        "raw_path": request.target,
        "query_string": query.encode("latin-1"),
        "headers": list(request.headers),
    }
    channel = _AsgiChannel(conn, stream, request, body)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.watch)
        await app(scope, channel.receive, channel.send)
        nursery.cancel_scope.cancel()
    if not channel.started and not channel.disconnected.is_set():
        # The app returned without answering: what a crashed handler looks like to the client.
        await channel.send({"type": "http.response.start", "status": 500, "headers": [(b"content-length", b"0")]})
        await channel.send({"type": "http.response.body", "body": b"", "more_body": False})
    return channel.done and not channel.close and not channel.disconnected.is_set()


@asynccontextmanager
async def run_fake_engine(
    behavior: FakeEngineBehavior | None = None, *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[FakeEngine]:
    """Serve a fake engine until the block exits; hanging responses are cancelled then."""
    behavior = behavior if behavior is not None else FakeEngineBehavior()
    observed = FakeEngineObservations()
    app = FakeEngineApp(behavior, observed)
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port: int = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trio.serve_listeners, partial(_serve_connection, app), listeners))
        engine = FakeEngine(
            url=f"http://{host}:{bound_port}", port=bound_port, behavior=behavior, observed=observed, app=app
        )
        try:
            yield engine
        finally:
            # Cancelling handlers at shutdown is not a client disconnect: do not record them.
            app.closing = True
            nursery.cancel_scope.cancel()


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
    p.add_argument("--status-before-body", type=int, default=None, help="fail every request with this status")
    p.add_argument("--close-mid-stream-after", type=int, default=None, metavar="N")
    p.add_argument("--hang-mid-stream-after", type=int, default=None, metavar="N")
    p.add_argument("--hang-before-first-byte", action="store_true")
    p.add_argument("--saturate-at", type=int, default=None, metavar="N", help="generate N responses at once at most")
    return p.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    behavior = FakeEngineBehavior(
        models=args.models or ["fake-model"],
        chunks=args.chunks,
        chunk_delay=args.chunk_delay,
        first_byte_delay=args.first_byte_delay,
        prompt_tokens=args.prompt_tokens,
        api_key=args.api_key,
        close_after_stream=args.close_after_stream,
        status_before_body=args.status_before_body,
        close_mid_stream_after=args.close_mid_stream_after,
        hang_mid_stream_after=args.hang_mid_stream_after,
        hang_before_first_byte=args.hang_before_first_byte,
        saturate_at=args.saturate_at,
    )
    # Without a receiver SIGTERM would kill the process on the spot; this makes it a clean exit.
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
