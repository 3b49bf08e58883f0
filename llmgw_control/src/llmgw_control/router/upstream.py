"""The upstream HTTP client behind a small interface of our own.

The router speaks only to ``UpstreamClient``; the one implementation wraps httpx2 (the
maintained fork of httpx: httpx 0.28's pool does quadratic work per request and collapsed under
128 concurrent streams in our measurements). Keeping httpx2's types out of the router means the
client can be swapped -- for a leaner h11 pool if CPU ever becomes the limit -- without touching
the retry and relay logic.

Errors are translated into three kinds the router acts on differently:
``UpstreamConnectError`` (nothing was sent: safe to try another replica),
``UpstreamClosedEarly`` (the connection died before any response byte: llama-server closes
connections after every stream while advertising keep-alive, so a pooled connection may be dead;
safe to retry once on a fresh connection), and ``UpstreamBodyError`` (the response broke off).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

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
    def headers(self) -> Sequence[tuple[str, str]]: ...
    def content_type(self) -> str: ...
    def iter_chunks(self) -> AsyncGenerator[bytes, None]: ...


class UpstreamClient(Protocol):
    def open(
        self, method: str, url: str, *, headers: Sequence[tuple[str, str]], body: bytes, connect_timeout: float
    ) -> AbstractAsyncContextManager[UpstreamResponse]:
        """Response headers are in when it enters; the body streams after; exit closes the request."""
        ...

    async def aclose(self) -> None: ...


class _Httpx2Response:
    def __init__(self, response: httpx2.Response) -> None:
        self._response = response

    @property
    def status_code(self) -> int:
        return self._response.status_code

    @property
    def headers(self) -> Sequence[tuple[str, str]]:
        return list(self._response.headers.items())

    def content_type(self) -> str:
        return self._response.headers.get("content-type", "")

    async def iter_chunks(self) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx2.TransportError as exc:
            raise UpstreamBodyError(_describe(exc)) from exc


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


class Httpx2Upstream:
    """httpx2's connection pool, used at the transport level.

    The client layer (URL merging, cookies, auth, redirects, event hooks) does nothing a proxy
    needs and cost about a fifth of the gateway's CPU per request in a profile; requests are
    built against cached URL objects and handed straight to the pooled transport.
    """

    def __init__(self, *, max_keepalive: int = 512, keepalive_expiry: float = 30.0, shards: int = 8) -> None:
        # httpcore2's pool walks every connection it holds (probing idle ones with a poll) twice
        # per request: with 128 requests in flight that walk was the largest single cost of a
        # proxied request. Requests are spread round-robin over several smaller pools instead,
        # so each walk covers a fraction of the connections.
        self._transports = [
            httpx2.AsyncHTTPTransport(
                limits=httpx2.Limits(max_connections=None, max_keepalive_connections=max(1, max_keepalive // shards),
                                     keepalive_expiry=keepalive_expiry),
                trust_env=False,
            )
            for _ in range(shards)
        ]
        self._turn = 0
        self._urls: dict[str, httpx2.URL] = {}
        self._timeouts: dict[float, dict[str, float | None]] = {}

    def _url(self, url: str) -> httpx2.URL:
        parsed = self._urls.get(url)
        if parsed is None:
            if len(self._urls) > 10_000:
                self._urls.clear()  # replicas come and go; never grow without bound
            parsed = self._urls[url] = httpx2.URL(url)
        return parsed

    @asynccontextmanager
    async def open(
        self, method: str, url: str, *, headers: Sequence[tuple[str, str]], body: bytes, connect_timeout: float
    ) -> AsyncIterator[UpstreamResponse]:
        timeouts = self._timeouts.get(connect_timeout)
        if timeouts is None:
            # Phase deadlines are trio scopes in the router, where the phase is known for the
            # error message; httpx2's own read timeout would fire mid-stream without that context.
            timeouts = self._timeouts[connect_timeout] = {"connect": connect_timeout, "read": None,
                                                          "write": 60.0, "pool": None}
        request = httpx2.Request(method, self._url(url), headers=list(headers), content=body,
                                 extensions={"timeout": timeouts})
        self._turn = (self._turn + 1) % len(self._transports)
        try:
            response = await self._transports[self._turn].handle_async_request(request)
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
            raise UpstreamConnectError(_describe(exc)) from exc
        except (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError) as exc:
            raise UpstreamClosedEarly(_describe(exc)) from exc
        except httpx2.TransportError as exc:
            raise UpstreamConnectError(_describe(exc)) from exc
        try:
            yield _Httpx2Response(response)
        finally:
            # Closing an unfinished response closes its connection, which is how the engine
            # learns that the client went away; shield it so cancellation cannot skip it.
            with trio.move_on_after(5) as scope:
                scope.shield = True
                await response.aclose()

    async def aclose(self) -> None:
        for transport in self._transports:
            await transport.aclose()
