"""Serving an ASGI app with hypercorn's protocol, inside the caller's nursery.

hypercorn's ``serve`` is not used: its per-connection loop costs the data path more than the
protocol work does (see ``http_connection``). This is the rest of what ``serve`` does -- bind,
the app's lifespan, accept, TLS, and a graceful stop -- around our connection loop, plus the
bound on open connections: beyond ``max_connections`` a connection is answered 503 and closed.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import parse_socket_addr, repr_socket_addr, wrap_app

from llmgw_shared.logs import get_logger

from ..api_errors import openai_error_body
from .config import ListenersConfig
from .connection import Connection
from .listener import PEER_GONE, ErrorBody, Listener, log_connection_failure, refusal

log = get_logger(__name__)

# Refusals over max_connections in progress at once; beyond, a connection is closed unanswered.
# Each lasts at most _REFUSAL_SECONDS, so a flood of connections costs a bounded amount of work.
_MAX_REFUSING = 64
_REFUSAL_SECONDS = 2.0
# What a refused client may still send (its request head) is read and dropped up to this much,
# so that the 503 is not lost to the reset a close with unread bytes causes.
_REFUSAL_READ_BYTES = 64 * 1024
# Refusals are logged at most this often per listener: a flood must not flood the log too.
_REFUSAL_LOG_INTERVAL = 60.0

# The current certificate for a TLS listener (reloaded on SIGHUP, see ``client_tls``).
TlsContext = Callable[[], ssl.SSLContext]


def bind(address: str, *, reuse_port: bool = False) -> list[socket.socket]:
    """The sockets for ``address`` (``host:port``), bound but not listening yet.

    A listener bound first has its address (port 0 gets one) before the app that serves it is
    built: the agent listener's URL goes into what the fleet hands nodes (``app.bind_agents``).
    ``reuse_port``: other processes of the same user may bind the same port (``SO_REUSEPORT``),
    and the kernel spreads new connections over them (the workers, see ``workers.py``).
    """
    config = HypercornConfig()
    config.bind = [address]
    # hypercorn sets SO_REUSEPORT exactly when it runs more than one worker itself.
    config.workers = 2 if reuse_port else 1
    return list(config.create_sockets().insecure_sockets)


def bound_url(sockets: Sequence[socket.socket], *, tls: bool) -> str:
    """The URL of the first of ``sockets``, as a client reaches it."""
    return f"{'https' if tls else 'http'}://{repr_socket_addr(sockets[0].family, sockets[0].getsockname())}"


async def serve_asgi(
    app: Any,
    address: str | Sequence[socket.socket],
    *,
    shutdown: trio.Event,
    grace: float,
    name: str,
    limits: ListenersConfig | None = None,
    error_body: ErrorBody = openai_error_body,
    tls: TlsContext | None = None,
    websocket_max_message_size: int | None = None,
    keep_alive_timeout: float = 75.0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown`` is set; in-flight requests then get ``grace`` seconds to finish.

    ``address`` is ``host:port``, or sockets ``bind`` returned.

    No signal handlers are installed here: the caller owns SIGTERM (and SIGHUP, for ``tls``).
    """
    config = HypercornConfig()
    # Clients of an LLM gateway reuse connections between long requests; 5 s (the default)
    # made them reconnect after every pause.
    config.keep_alive_timeout = keep_alive_timeout
    config.backlog = 1024
    config.accesslog = None
    # Route hypercorn's own messages through our handler instead of a second one of its own.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.include_server_header = False
    if websocket_max_message_size is not None:
        config.websocket_max_message_size = websocket_max_message_size
    # Quart would cut bodies at 60 s; hypercorn's own limits stay at their defaults.
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, state)
    context = WorkerContext(None)
    listener = Listener(name, limits or ListenersConfig(), error_body)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            sockets = bind(address) if isinstance(address, str) else list(address)
            for sock in sockets:
                sock.listen(config.backlog)
            listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]
            url = bound_url(sockets, tls=tls is not None)
            log.info("%s listening on %s", name, url, extra={"listener": name, "url": url})
            task_status.started(url)
            handler = partial(_serve_connection, wrapped, config, context, state, listener, tls)
            async with trio.open_nursery() as accepting:
                accepting.start_soon(partial(trio.serve_listeners, handler, listeners, handler_nursery=connections))
                await shutdown.wait()
                accepting.cancel_scope.cancel()
            # Idle keep-alive connections close now; requests in progress get the grace period,
            # and so does any write in progress (a client that stopped reading cannot hold on).
            await context.terminated.set()
            ends = trio.current_time() + grace
            listener.cap_writes(ends)
            connections.cancel_scope.deadline = ends
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def _serve_connection(
    app: Any,
    config: HypercornConfig,
    context: WorkerContext,
    state: dict[str, Any],
    listener: Listener,
    tls: TlsContext | None,
    stream: trio.SocketStream,
) -> None:
    """One accepted connection, isolated: whatever it raises ends it alone (``Connection.run`` logs it)."""
    limits = listener.limits
    if listener.count >= limits.max_connections:
        await refuse_connection(stream, listener, tls)
        return
    listener.count += 1
    try:
        accepted = trio.current_time()
        socket = stream.socket
        client = parse_socket_addr(socket.family, socket.getpeername())
        server = parse_socket_addr(socket.family, socket.getsockname())
        served: trio.SocketStream | trio.SSLStream[trio.SocketStream] = stream
        if tls is not None:
            served = trio.SSLStream(stream, tls(), server_side=True, https_compatible=True)
            # A client that opens a connection and never finishes its handshake holds it no longer
            # than a request's head may take.
            with trio.CancelScope(deadline=accepted + limits.head_timeout) as handshake:
                await served.do_handshake()
            if handshake.cancelled_caught:
                log.debug("TLS handshake with %s timed out", client[0] if client else "?")
                return
        connection = Connection(
            app,
            config,
            context,
            state,
            served,
            listener,
            client=client,
            server=server,
            first_request_by=accepted + config.keep_alive_timeout,
        )
        listener.open.add(connection)
        try:
            await connection.run()
        finally:
            listener.open.discard(connection)
    except* PEER_GONE:
        pass  # a failed handshake (trio reports TLS errors as a broken stream) or a client that left
    except* Exception as failure:
        log_connection_failure(failure, listener=listener.name, peer="?", request_id=None)
    finally:
        listener.count -= 1
        await trio.aclose_forcefully(stream)


async def refuse_connection(stream: trio.SocketStream, listener: Listener, tls: TlsContext | None) -> None:
    """Over ``max_connections``: a 503 that says so, then the connection is closed.

    The answer goes before the request is read (there is no room to serve it); what the client
    sends meanwhile is read and dropped for a moment, so the 503 is not lost to a reset.
    """
    now = trio.current_time()
    listener.refused += 1
    if now >= listener.refusals_logged_at + _REFUSAL_LOG_INTERVAL:
        listener.refusals_logged_at = now
        log.warning(
            "%s listener: %d connection(s) refused with 503 (max_connections %d reached)",
            listener.name,
            listener.refused,
            listener.limits.max_connections,
            extra={"listener": listener.name, "refused": listener.refused},
        )
        listener.refused = 0
    if listener.refusing >= _MAX_REFUSING:
        await trio.aclose_forcefully(stream)
        return
    listener.refusing += 1
    served: trio.SocketStream | trio.SSLStream[trio.SocketStream] = stream
    try:
        with trio.move_on_after(_REFUSAL_SECONDS):
            if tls is not None:
                served = trio.SSLStream(stream, tls(), server_side=True, https_compatible=True)
                await served.do_handshake()
            message = (
                f"The {listener.name} listener has {listener.limits.max_connections} connections open, "
                "its limit; retry in a moment."
            )
            body = listener.error_body(503, "too_many_connections", message)
            await served.send_all(refusal(503, body, (b"retry-after", b"1")))
            if tls is None:
                await stream.send_eof()
            read = 0
            while read < _REFUSAL_READ_BYTES and (data := await served.receive_some(_REFUSAL_READ_BYTES)):
                read += len(data)
    except* PEER_GONE:
        pass
    finally:
        listener.refusing -= 1
        await trio.aclose_forcefully(served)
