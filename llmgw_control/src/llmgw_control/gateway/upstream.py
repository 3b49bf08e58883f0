"""The upstream HTTP client behind a small interface of our own.

The gateway speaks only to ``UpstreamClient``; the one implementation speaks HTTP/1.1 through
httpx2's own protocol layer (``httpcore2.AsyncHTTP11Connection``, the maintained fork's
connection class) and pools those connections itself. Keeping httpx2's types out of the gateway
means the client can be swapped without touching the retry and relay logic.

The keep-alive race is settled here, below every caller: engines (llama-server, uvicorn) close
idle keep-alive connections whenever they like, so a pooled connection may be closed as it is
taken or as a request goes out on it. A connection found closed at checkout is skipped; a request
that fails on a *reused* connection before any response byte is re-sent once on a fresh one to the
same engine. Neither reaches the gateway as a failure (issue 28: httpcore2 2.17 moved its check for
a server-closed idle connection out of ``has_expired()``, which our checkout consulted, and 0.8% of
requests under load became 502s).

Errors are translated into three kinds the gateway acts on differently:
``UpstreamConnectError`` (nothing was sent: safe to try another replica),
``UpstreamClosedEarly`` (a *fresh* connection died before any response byte: the engine itself is
in trouble), and ``UpstreamBodyError`` (the response broke off).
Nothing else leaves ``open`` before the response head: any other failure of the connection layer
is an ``UpstreamConnectError``, so the gateway retries it or answers 502, never 500.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, Protocol

import attrs
import httpcore2
import httpx2
import trio


class UpstreamError(Exception):
    pass


class UpstreamConnectError(UpstreamError):
    pass


class UpstreamClosedEarly(UpstreamError):
    pass


class UpstreamBodyError(UpstreamError):
    pass


class UpstreamResponse(Protocol):
    @property
    def status_code(self) -> int: ...
    @property
    def resent(self) -> bool:
        """The request went out twice: its pooled connection was closed under it, a fresh one answered."""
        ...

    def content_type(self) -> str: ...
    async def next_chunk(self) -> bytes | None:
        """The next piece of the body as it arrived, None at its end; UpstreamBodyError if it broke off."""
        ...


class UpstreamClient(Protocol):
    def open(
        self, method: str, url: str, *, headers: Sequence[tuple[str, str]], body: bytes, connect_timeout: float
    ) -> AbstractAsyncContextManager[UpstreamResponse]:
        """Response headers are in when it enters; the body streams after; exit closes the request."""
        ...

    async def run(self) -> None:
        """Upkeep until cancelled (closing connections nobody will use again)."""
        ...

    async def aclose(self) -> None: ...


# Errors of a request whose response never started: the connection was dead or died under us.
# ConnectionNotAvailable: httpcore2 found the connection closed (2.17 checks an idle connection's
# socket as the request starts, closes it if the engine has, and sends nothing) or busy (the pool
# handing one connection to two requests did this, issue 15); a fresh connection serves the request.
_CLOSED_EARLY = (
    httpcore2.RemoteProtocolError,
    httpcore2.ReadError,
    httpcore2.WriteError,
    httpcore2.ConnectionNotAvailable,
)
_BODY_ERRORS = (httpcore2.NetworkError, httpcore2.ProtocolError, httpcore2.TimeoutException)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


class _Response:
    def __init__(self, response: httpcore2.Response, give_back: Callable[[], Awaitable[None]], *, resent: bool) -> None:
        self._response = response
        self._give_back = give_back
        self._closed = False
        self.status_code = response.status
        self.resent = resent
        stream = response.stream
        assert isinstance(stream, AsyncIterable)
        self._chunks = aiter(stream)

    def content_type(self) -> str:
        for key, value in self._response.headers:
            if key.lower() == b"content-type":
                return value.decode("latin-1")
        return ""

    async def next_chunk(self) -> bytes | None:
        # A method rather than an async generator of our own: one generator layer and its
        # aclosing() per request were measurable on a path that costs a few milliseconds.
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            # The body is complete: the connection goes back to the pool now, before the client
            # has its last bytes. A client sending its next request at once would otherwise find
            # no idle connection and open a new one, every time.
            await self.aclose()
            return None
        except _BODY_ERRORS as exc:
            raise UpstreamBodyError(_describe(exc)) from exc

    async def aclose(self) -> None:
        """Close the response and give the connection back; closing an unfinished one closes it.

        That close is how the engine learns that the client went away: shielded, so a
        cancellation cannot skip it, and bounded, so a wedged close cannot hold the request.
        """
        if self._closed:
            return
        self._closed = True
        with trio.move_on_after(5) as scope:
            scope.shield = True
            chunks = self._chunks
            if isinstance(chunks, AsyncGenerator):
                await chunks.aclose()
            await self._response.aclose()
            await self._give_back()


class _HeldWritesStream(httpcore2.AsyncNetworkStream):
    """A connection's socket, with writes held until the response is read.

    httpcore2 writes a request as head, body and end-of-message, one ``send`` each; on loopback
    every send runs the whole TCP path and wakes the engine, so three cost about three times one.
    Nothing needs the bytes before the response is awaited, so they leave together then.
    Deadlines are the gateway's own trio scopes (it knows the phase for the error message), so no
    per-call timeout scope is opened here.
    """

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType) -> None:
        self._stream = stream
        self._socket = socket
        self._held: list[bytes] = []

    # httpcore2's interface: the timeouts are ours to ignore (see above).
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        try:
            if self._held:
                held, self._held = self._held, []
                await self._stream.send_all(held[0] if len(held) == 1 else b"".join(held))
            return bytes(await self._stream.receive_some(max_bytes))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpcore2.ReadError(_describe(exc.__cause__ or exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if buffer:
            self._held.append(buffer)

    async def aclose(self) -> None:
        self._held = []
        # A TLS close to a peer that is gone fails; the socket is closed all the same, and a
        # checkout closing a dead pooled connection must not fail the request it serves.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await self._stream.aclose()

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return self._socket.is_readable()
        if info == "socket":
            return self._socket
        if info == "ssl_object" and isinstance(self._stream, trio.SSLStream):
            return self._stream._ssl_object
        return None


class _Connection(httpcore2.AsyncHTTP11Connection):
    """httpcore2's HTTP/1.1 connection, with the socket it was built on at hand.

    Whether the engine has closed an idle connection is our pool's question, asked of the socket
    itself: httpcore2 asked it in ``has_expired()`` up to 2.16 and only when a request starts from
    2.17 on, and a pool that relied on either version's placement broke on the other.
    """

    def __init__(self, origin: httpcore2.Origin, stream: _HeldWritesStream, *, keepalive_expiry: float) -> None:
        super().__init__(origin, stream, keepalive_expiry=keepalive_expiry)
        self.held_writes = stream

    def unusable(self) -> bool:
        """Expired, or readable while idle (the engine closed it: llama-server does after a stream)."""
        return self.has_expired() or (self.is_idle() and bool(self.held_writes.get_extra_info("is_readable")))


@attrs.frozen
class _Target:
    url: httpcore2.URL
    origin: tuple[bytes, bytes, int]
    host_header: bytes


class Httpx2Upstream:
    """httpx2's HTTP/1.1 connections, pooled as one stack of idle connections per origin.

    httpx2's own pool (httpcore2's ``AsyncConnectionPool``) walks every connection it holds,
    polling each idle one, twice per request: with 128 requests in flight that walk was the
    largest single cost of a proxied request, and the client layer above it (URL merging,
    cookies, redirects) another fifth. A proxy needs neither: it takes the most recently used
    idle connection to the replica (one poll, to skip one the engine has closed) or opens one,
    and puts it back when the response is done.
    """

    # Idle connections kept per engine: as many as a replica's default slots (256, vLLM's
    # max_num_seqs), so a burst that filled every slot finds its connections again. An idle one is
    # closed after keepalive_expiry, checked every sweep_every: one the engine closed first
    # (llama-server and uvicorn do after 5 s) is skipped by the poll at checkout, so the expiry
    # only bounds the sockets held toward an engine gone quiet.
    def __init__(
        self,
        *,
        max_idle_per_origin: int = 256,
        keepalive_expiry: float = 30.0,
        sweep_every: float = 10.0,
        on_resend: Callable[[], None] | None = None,
    ) -> None:
        self._max_idle = max_idle_per_origin
        # Told each time a request is re-sent on a fresh connection (a metric): the keep-alive
        # race is expected and harmless, but a rate of it says an engine closes connections early.
        self._on_resend = on_resend
        self._sweep_every = sweep_every
        self._keepalive_expiry = keepalive_expiry
        self._idle: dict[tuple[bytes, bytes, int], list[_Connection]] = {}
        self._targets: dict[str, _Target] = {}
        self._ssl_context: ssl.SSLContext | None = None
        self._extensions = {"timeout": {"connect": None, "read": None, "write": None, "pool": None}}
        self._closed = False

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) > 10_000:
                self._targets.clear()  # replicas come and go; never grow without bound
            parsed = httpcore2.URL(url)
            if parsed.scheme not in (b"http", b"https"):
                raise UpstreamConnectError(f"unsupported URL scheme in {url!r}")
            origin = parsed.origin
            default_port = 443 if origin.scheme == b"https" else 80
            host = b"[%s]" % origin.host if b":" in origin.host else origin.host  # an IPv6 literal
            if origin.port != default_port:
                host = b"%s:%d" % (host, origin.port)
            target = self._targets[url] = _Target(parsed, (origin.scheme, origin.host, origin.port), host)
        return target

    @asynccontextmanager
    async def open(
        self, method: str, url: str, *, headers: Sequence[tuple[str, str]], body: bytes, connect_timeout: float
    ) -> AsyncIterator[UpstreamResponse]:
        target = self._target(url)
        request = httpcore2.Request(
            method.encode(),
            target.url,
            headers=[
                (b"host", target.host_header),
                (b"content-length", str(len(body)).encode()),
                *((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers),
            ],
            content=body,
            extensions=self._extensions,
        )
        connection, reused = await self._checkout(target, connect_timeout)
        resent = False
        try:
            response = await self._send(connection, request)
        except UpstreamClosedEarly:
            if not reused:
                raise
            # The engine closed this pooled connection as the request went out (the keep-alive
            # race): nothing was answered, so the request goes once more, on a connection of its
            # own. Were the fresh one to fail too, that is the engine's doing, and the gateway's.
            resent = True
            if self._on_resend is not None:
                self._on_resend()
            connection = await self._open_connection(target, connect_timeout)
            response = await self._send(connection, request)
        relayed = _Response(response, partial(self._checkin, target, connection), resent=resent)
        try:
            yield relayed
        finally:
            await relayed.aclose()

    @staticmethod
    async def _send(connection: _Connection, request: httpcore2.Request) -> httpcore2.Response:
        """The response head from ``connection``, every failure before it one of our three errors."""
        try:
            return await connection.handle_async_request(request)
        except _CLOSED_EARLY as exc:
            raise UpstreamClosedEarly(_describe(exc)) from exc
        except (httpcore2.ProtocolError, httpcore2.NetworkError, httpcore2.TimeoutException) as exc:
            raise UpstreamConnectError(_describe(exc)) from exc
        except Exception as exc:
            # Whatever else the connection layer raises before a response exists (httpcore2 has
            # closed the connection by then), the request was not answered: the gateway may try
            # elsewhere. Uncaught, it would be a 500 for a fault on the engine's side.
            raise UpstreamConnectError(f"{type(exc).__name__}: {_describe(exc)}") from exc

    async def _checkout(self, target: _Target, connect_timeout: float) -> tuple[_Connection, bool]:
        """A connection for one request, and whether it was reused from the pool."""
        # The idle list is looked up again after every await: closing a dead connection yields,
        # and a reference kept across it may be to a list the sweep has emptied meanwhile.
        while idle := self._idle.get(target.origin):
            connection = idle.pop()
            if not connection.unusable():
                return connection, True
            await connection.aclose()
        return await self._open_connection(target, connect_timeout), False

    async def _open_connection(self, target: _Target, connect_timeout: float) -> _Connection:
        if self._closed:
            raise UpstreamConnectError("the gateway is shutting down")
        return _Connection(
            httpcore2.Origin(*target.origin),
            await self._connect(target, connect_timeout),
            keepalive_expiry=self._keepalive_expiry,
        )

    async def _connect(self, target: _Target, within: float) -> _HeldWritesStream:
        scheme, host, port = target.origin
        try:
            with trio.fail_after(within):
                socket_stream = await trio.open_tcp_stream(host.decode("ascii"), port)
                stream: trio.abc.Stream = socket_stream
                if scheme == b"https":
                    if self._ssl_context is None:
                        self._ssl_context = httpx2.create_ssl_context()
                    stream = trio.SSLStream(
                        socket_stream, self._ssl_context, server_hostname=host.decode("ascii"), https_compatible=True
                    )
                    try:
                        await stream.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(socket_stream)
                        raise
        except trio.TooSlowError:
            raise UpstreamConnectError(f"connect timed out after {within:g} s") from None
        except (OSError, trio.BrokenResourceError) as exc:
            raise UpstreamConnectError(_describe(exc.__cause__ or exc)) from exc
        # trio turns Nagle off on its TCP streams: an SSE event is never held back for an ACK.
        return _HeldWritesStream(stream, socket_stream.socket)

    async def _checkin(self, target: _Target, connection: _Connection) -> None:
        if not connection.is_idle():
            return  # closed: the response was cut short, or the engine ended the connection
        idle = self._idle.setdefault(target.origin, [])
        if len(idle) < self._max_idle and not self._closed:
            idle.append(connection)
        else:
            await connection.aclose()

    async def run(self) -> None:
        """Close expired idle connections every ``sweep_every`` seconds.

        Connections to replicas nobody asks for any more would otherwise stay open forever. Done
        in a task of its own rather than on a request's checkout: the sweep polls every idle
        connection, and a request should not pay for that.
        """
        while True:
            await trio.sleep(self._sweep_every)
            await self._close_expired()

    async def _close_expired(self) -> None:
        # Sorted out before the first await: a close yields, and a request taking or returning a
        # connection meanwhile must find the idle lists whole. Each list is changed in place,
        # never replaced: a checkout that holds a list while it closes a dead connection must
        # see the sweep's removals. A replacement list left it popping connections still listed
        # in the new one, so one connection went to two requests (issue 15: a 500 about once in
        # 10,000 requests, on the sweep's beat).
        expired: list[_Connection] = []
        for origin, idle in list(self._idle.items()):
            keep: list[_Connection] = []
            for connection in idle:
                (expired if connection.unusable() else keep).append(connection)
            idle[:] = keep
            if not keep:
                del self._idle[origin]
        for connection in expired:
            await connection.aclose()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                await connection.aclose()
