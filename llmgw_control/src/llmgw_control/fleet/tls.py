"""TLS, and mutual TLS, on the agent listener.

Hypercorn terminates TLS itself but does not tell the application which client certificate was
presented, and with mutual TLS the node id must come from that certificate. So when TLS is on,
control runs its own small TLS front on the agent address: it completes the handshake (requiring
a client certificate signed by the configured CA when one is set), reads the node id from the
certificate, opens a loopback connection to the agent app, records that connection's local port
against the node id, and relays bytes both ways. The agent app looks the node id up by the
client port hypercorn reports, so the identity travels with the connection, not with anything
the client can say.
"""

from __future__ import annotations

import contextlib
import ssl
from typing import Any

import trio

from llmgw_shared.config import parse_host_port
from llmgw_shared.logs import get_logger

from ..api_errors import openai_error_body
from ..transport.config import ListenersConfig
from ..transport.listener import PEER_GONE, ErrorBody, Listener, log_connection_failure
from ..transport.serving import refuse_connection

log = get_logger(__name__)

# A node's TLS handshake must finish this long after its connect: a node's own connect timeout is
# 10 s, and a peer that never finishes one holds no connection longer.
_HANDSHAKE_TIMEOUT = 10.0
# Bytes relayed per read, each way: 64 KiB, the read size of the listeners behind (MAX_RECV).
_CHUNK = 64 * 1024


def node_id_of(certificate: dict[str, Any]) -> str | None:
    """The certificate's common name, else its first DNS name."""
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    for kind, value in certificate.get("subjectAltName", ()):
        if kind == "DNS":
            return str(value)
    return None


class Identities:
    """Node ids proven by client certificates, by the local port of the relayed connection."""

    def __init__(self, mutual: bool) -> None:
        self.mutual = mutual
        self._by_port: dict[int, str] = {}

    def get(self, port: int) -> str | None:
        return self._by_port.get(port)

    def bind(self, port: int, node_id: str) -> None:
        self._by_port[port] = node_id

    def unbind(self, port: int) -> None:
        self._by_port.pop(port, None)


async def _pump(source: trio.abc.ReceiveStream, sink: trio.abc.SendStream, write_timeout: float) -> None:
    while chunk := await source.receive_some(_CHUNK):
        # A peer that stops reading ends the relay after write_timeout (listeners.write_timeout),
        # as the listener behind ends a connection whose client stops reading.
        with trio.move_on_after(write_timeout) as writing:
            await sink.send_all(chunk)
        if writing.cancelled_caught:
            return


async def _relay(
    stream: trio.SocketStream, context: ssl.SSLContext, backend_port: int, identities: Identities, write_timeout: float
) -> None:
    tls = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
    peer = "?"
    try:
        peer = str(stream.socket.getpeername()[0])
        with trio.fail_after(_HANDSHAKE_TIMEOUT):
            await tls.do_handshake()
    except (OSError, trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError) as exc:
        log.warning("TLS handshake with %s failed: %s", peer, exc.__cause__ or exc)
        await trio.aclose_forcefully(tls)
        return
    node_id = node_id_of(tls.getpeercert() or {})
    try:
        backend = await trio.open_tcp_stream("127.0.0.1", backend_port)
    except BaseException:
        await trio.aclose_forcefully(tls)
        raise
    local_port: int | None = None
    try:
        local_port = backend.socket.getsockname()[1]
        if node_id is not None:
            identities.bind(local_port, node_id)
        log.debug("relaying a TLS connection", extra={"peer": peer, "node_id": node_id})
        async with trio.open_nursery() as nursery:

            async def pump(source: trio.abc.ReceiveStream, sink: trio.abc.SendStream) -> None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await _pump(source, sink, write_timeout)
                # Either side ending ends the relay: TLS cannot half-close.
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, tls, backend)
            nursery.start_soon(pump, backend, tls)
    finally:
        if local_port is not None:
            identities.unbind(local_port)
        await trio.aclose_forcefully(backend)
        await trio.aclose_forcefully(tls)


async def bind_tls_front(address: str) -> tuple[list[trio.SocketListener], str]:
    """The TLS front's listening sockets on ``address`` and their https URL, before it serves."""
    host, port = parse_host_port(address, what="agents.listen")
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    return listeners, f"https://{host}:{bound[1]}"


async def serve_tls_front(
    listeners: list[trio.SocketListener],
    url: str,
    backend_port: int,
    context: ssl.SSLContext,
    identities: Identities,
    *,
    shutdown: trio.Event,
    limits: ListenersConfig | None = None,
    error_body: ErrorBody = openai_error_body,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The agent listener's TLS front on ``listeners`` (``bind_tls_front``), bounded and timed as
    ``limits`` says (``[listeners]``)."""
    log.info("agents (TLS%s) listening on %s", ", client certificates required" if identities.mutual else "", url)
    front = Listener("agents (TLS)", limits or ListenersConfig(), error_body)

    async def handle(stream: trio.SocketStream) -> None:
        # Isolated like every connection (transport/connection.py): what one raises ends it alone.
        # Bounded like every listener: beyond max_connections, a 503 and the close.
        if front.count >= front.limits.max_connections:
            await refuse_connection(stream, front, lambda: context)
            return
        front.count += 1
        try:
            await _relay(stream, context, backend_port, identities, front.limits.write_timeout)
        except* PEER_GONE:
            pass
        except* Exception as failure:
            log_connection_failure(failure, listener=front.name, peer="?", request_id=None)
        finally:
            front.count -= 1
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(url)
        await shutdown.wait()
        nursery.cancel_scope.cancel()
