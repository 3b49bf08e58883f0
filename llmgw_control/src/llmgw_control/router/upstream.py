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
    def __init__(self, *, max_keepalive: int = 512, keepalive_expiry: float = 30.0) -> None:
        self._client = httpx2.AsyncClient(
            # Phase deadlines are trio scopes in the router, where the phase is known for the
            # error message; httpx2's own read timeout would fire mid-stream without that context.
            timeout=httpx2.Timeout(connect=5.0, read=None, write=60.0, pool=None),
            limits=httpx2.Limits(max_connections=None, max_keepalive_connections=max_keepalive,
                                 keepalive_expiry=keepalive_expiry),
            follow_redirects=False,
            trust_env=False,
        )

    @asynccontextmanager
    async def open(
        self, method: str, url: str, *, headers: Sequence[tuple[str, str]], body: bytes, connect_timeout: float
    ) -> AsyncIterator[UpstreamResponse]:
        request = self._client.build_request(
            method, url, headers=list(headers), content=body,
            timeout=httpx2.Timeout(connect=connect_timeout, read=None, write=60.0, pool=None),
        )
        try:
            response = await self._client.send(request, stream=True)
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
        await self._client.aclose()
