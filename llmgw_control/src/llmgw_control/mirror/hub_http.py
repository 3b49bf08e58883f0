"""The HTTP client huggingface-hub sends through: every request passes the guard, within a deadline.

huggingface-hub makes its own requests (``list_models``, ``list_repo_tree``), follows redirects
and ``Link: rel=next`` pages, and retries with sleeps; none of that may leave the rules the
downloads keep. The library takes its client from a factory (``set_client_factory``); ours
sends through ``GuardedTransport``, which sees each request the client sends, so the first
request, every redirect hop and every next page alike:

- refuses it unless ``NetGuard.check_blocking`` allows the URL (the same rules as a download:
  the endpoint or ``allow_hosts``, every address public or in ``allow_networks``),
- judges a redirect's ``Location`` before the client follows it (and the hop again when sent),
- sends the ``Authorization`` header (and cookies) only to the endpoint's own origin,
- refuses once the call's deadline (``hub.timeout``) has passed, and gives each connect, read and
  write at most what is left of it (``_DeadlineStream``: a head or body trickled a byte at a
  time too): a Hub that accepts and never answers costs one call its deadline, never a thread
  for ever,
- connects to the address the guard checked (``_PinnedBackend``), never resolving the name a
  second time: a DNS answer that changes between the check and the connect (rebinding) is not
  followed,
- turns what the library would retry (timeouts, network errors, 408/429/5xx) into an error that
  it does not retry: a retry's sleep (a hostile ``Retry-After`` included) would outlive the
  deadline, and the operator on the page can ask again,
- bounds a call to ``MAX_REQUESTS`` requests and each body to ``MAX_BODY`` bytes, uncompressed
  (``Accept-Encoding: identity``; a compressed answer is refused, a gzip bomb among them).

The rules come from the call (``HubCall``, set in a context variable by the thread that runs
it): a request outside a call is refused, so nothing else in the process can use the client
to bypass them.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import attrs
import httpcore2
import httpx2
from httpcore2._types import SOCKET_OPTION
from huggingface_hub import set_client_factory
from huggingface_hub.utils._http import hf_request_event_hook

from .net_guard import CheckedUrl, NetGuard, UrlRefused

# One connect, and one wait for bytes: a Hub answers a search in well under a second; what waits
# longer is stalled. Each is cut to what is left of the call's deadline.
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 10.0
# Requests one call may send, redirects and pages together: a search is one, a tree of 2000
# files a few pages; a Hub that pages for ever is stopped here (and by the deadline).
MAX_REQUESTS = 50
# One answer's body: a search of 100 repositories is ~100 KiB, a tree page ~1 MiB.
MAX_BODY = 16 * 1024 * 1024
# Redirects one request may take (the Hub redirects a renamed repository once).
MAX_REDIRECTS = 5
# What huggingface-hub retries (with sleeps): answered as an error at once instead.
RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class HubRefused(Exception):
    """The guard refused a URL the Hub client was about to fetch (the message is safe to show)."""


class HubStalled(Exception):
    """The call's deadline passed, or a connect or read timed out."""


class HubUnreachable(Exception):
    """A connection to the Hub failed (refused, reset, not resolvable)."""


class HubAnswered(Exception):
    """The Hub answered a status the library would retry (rate limited, overloaded)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the Hub answered HTTP {status}")
        self.status = status


@attrs.define
class HubCall:
    """The rules for one Hub call's requests, and what it has used of them."""

    guard: NetGuard
    deadline: float  # time.monotonic()
    requests: int = 0
    # The request being sent's checked target: the one address set a new connection may use.
    target: CheckedUrl | None = None

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


CURRENT_CALL: ContextVar[HubCall | None] = ContextVar("llmgw_hub_call", default=None)


class _BoundedBody(httpx2.SyncByteStream):
    """A response body that stops at the deadline or ``MAX_BODY`` bytes (a trickling or endless body).

    Read after the transport has returned, so its errors are turned into ours here too: the
    library would retry an httpx timeout, after a sleep."""

    def __init__(self, inner: httpx2.SyncByteStream, call: HubCall) -> None:
        self.inner = inner
        self.call = call

    def __iter__(self) -> Iterator[bytes]:
        received = 0
        try:
            for chunk in self.inner:
                received += len(chunk)
                if received > MAX_BODY:
                    raise HubRefused(f"the Hub's answer is larger than {MAX_BODY} bytes")
                if self.call.remaining() <= 0:
                    raise HubStalled("the Hub's answer did not arrive in time")
                yield chunk
        except httpx2.TimeoutException:
            raise HubStalled("the Hub's answer did not arrive in time") from None
        except httpx2.TransportError as exc:
            raise HubUnreachable(f"{type(exc).__name__} while reading the Hub's answer") from None

    def close(self) -> None:
        self.inner.close()


def _within_deadline(timeout: float | None, timed_out: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of the current call; ``timed_out`` once nothing is."""
    call = CURRENT_CALL.get()
    if call is None:  # a pooled connection closed outside a call
        return timeout
    left = call.remaining()
    if left <= 0:
        raise timed_out("the Hub call's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore2.NetworkStream):
    """A connection whose every read and write ends by the current call's deadline (httpcore's
    timeouts are per read: a head trickled a byte per read timeout would outlive any deadline)."""

    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, _within_deadline(timeout, httpcore2.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, _within_deadline(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.NetworkStream:
        return _DeadlineStream(
            self.inner.start_tls(ssl_context, server_hostname, _within_deadline(timeout, httpcore2.ConnectTimeout))
        )

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class _PinnedBackend(httpcore2.SyncBackend):
    """Connects to the addresses ``NetGuard`` checked for the request being sent, not to a fresh
    lookup of its name (TLS still verifies the name: httpcore passes it to ``start_tls``)."""

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> httpcore2.NetworkStream:
        call = CURRENT_CALL.get()
        target = call.target if call is not None else None
        if target is None or target.port != port:
            raise httpcore2.ConnectError(f"no checked address for {host}:{port}")
        failed: Exception = httpcore2.ConnectError(f"{host} has no address")
        for address in target.addresses:
            try:
                stream = super().connect_tcp(
                    address.split("%", 1)[0],
                    port,
                    _within_deadline(timeout, httpcore2.ConnectTimeout),
                    local_address,
                    socket_options,
                )
            except httpcore2.ConnectError as exc:
                failed = exc
                continue
            return _DeadlineStream(stream)
        raise failed


class GuardedTransport(httpx2.BaseTransport):
    """A transport that applies the current ``HubCall``'s rules to every request (see the module)."""

    def __init__(self, inner: httpx2.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        call = CURRENT_CALL.get()
        if call is None:
            raise HubRefused("a Hub request outside a Hub call")
        url = str(request.url)
        call.requests += 1
        if call.requests > MAX_REQUESTS:
            raise HubRefused(f"the Hub took more than {MAX_REQUESTS} requests (redirects and pages) for one call")
        left = call.remaining()
        if left <= 0:
            raise HubStalled("the call's deadline passed")
        try:
            call.target = call.guard.check_blocking(url)
        except UrlRefused as exc:
            raise HubRefused(f"refused {safe_url(url)}: {exc}") from None
        if not call.guard.same_origin(url):
            for name in ("authorization", "cookie"):
                request.headers.pop(name, None)
        request.headers["accept-encoding"] = "identity"
        request.extensions["timeout"] = {
            "connect": min(CONNECT_TIMEOUT, left),
            "read": min(READ_TIMEOUT, left),
            "write": min(READ_TIMEOUT, left),
            "pool": min(CONNECT_TIMEOUT, left),
        }
        try:
            response = self.inner.handle_request(request)
        except httpx2.TimeoutException:
            raise HubStalled(f"{safe_url(url)} did not answer in time") from None
        except httpx2.TransportError as exc:
            raise HubUnreachable(f"{type(exc).__name__} from {request.url.host}") from None
        if response.status_code in RETRIED_STATUSES:
            response.close()
            raise HubAnswered(response.status_code)
        if response.headers.get("content-encoding", "identity").lower() != "identity":
            response.close()
            raise HubRefused("the Hub sent a compressed answer it was not asked for")
        if response.has_redirect_location:
            # Judged here, before the client follows it: a Location the client cannot even parse
            # is otherwise an error the library retries, with sleeps.
            try:
                target = str(request.url.join(response.headers["location"]))
                call.guard.check_blocking(target, redirect=False)
            except (httpx2.InvalidURL, ValueError) as exc:  # UrlRefused is a ValueError
                response.close()
                raise HubRefused(f"the Hub redirected to a URL it may not: {exc}") from None
        assert isinstance(response.stream, httpx2.SyncByteStream)
        response.stream = _BoundedBody(response.stream, call)
        return response

    def close(self) -> None:
        self.inner.close()


def guarded_client() -> httpx2.Client:
    """The client huggingface-hub shares between its calls (its factory)."""
    inner = httpx2.HTTPTransport(trust_env=False)
    # HTTPTransport takes no network backend: its pool is replaced by the same pool with ours
    # (tests/control/mirror/test_hub_stalled.py and test_hub_redirects.py fail if this stops working).
    inner._pool = httpcore2.ConnectionPool(
        ssl_context=httpx2.create_ssl_context(trust_env=False), network_backend=_PinnedBackend()
    )
    return httpx2.Client(
        transport=GuardedTransport(inner),
        # The library's own hook: a request id on each request, its offline mode, its debug log.
        event_hooks={"request": [hf_request_event_hook]},
        follow_redirects=True,
        max_redirects=MAX_REDIRECTS,
        trust_env=False,
        timeout=httpx2.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT),
    )


_installed = False


def install() -> None:
    """Make huggingface-hub send through ``guarded_client`` (once per process)."""
    global _installed
    if not _installed:
        set_client_factory(guarded_client)
        _installed = True


def safe_url(url: str) -> str:
    """A URL for messages: no query (signed URLs carry credentials there), bounded."""
    head = url.split("?", 1)[0].split("#", 1)[0]
    return head[:300]
