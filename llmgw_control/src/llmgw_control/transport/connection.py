"""One client connection: hypercorn's HTTP/1.1 protocol driven by a connection loop of our own.

hypercorn's own loop (``hypercorn.trio.tcp_server.TCPServer``) cost a proxied request more than
hypercorn's protocol work did. Every HTTP/1.1 response left in three socket writes (head, body,
and an empty write for the end of a sized body), each behind a lock and each a trip through
trio's scheduler; every write woke the client once more. And between two requests on a
keep-alive connection it started a new task for the idle timer (``nursery.start``, which waits
for the task to run) and cancelled it again at the next request. At concurrency 1 every one of
those scheduler trips is on the request's path.

Here the parsing, the ASGI scope and the HTTP semantics stay hypercorn's (``H11Protocol``: h11
and WebSockets); what changes is how its output reaches the socket, how the connection is timed,
and what it offers:

- While the app is inside an ASGI ``send``, the bytes hypercorn writes are held and leave as one
  write when that ``send`` returns, or with the body when it was the head of a sized answer: a
  whole JSON answer is one ``send()`` call, and so is each relayed SSE batch. Every write has a
  deadline (``write_timeout``; at shutdown, the end of the grace period).
- One task per connection is its only timer (``_watch``), and requests only move its deadline:
  the keep-alive wait between requests, a deadline for each request's head and one for its body
  (408 when missed), and the lingering close after a last answer.
- HTTP/1.1 only: ``Upgrade: h2c`` is ignored and the HTTP/2 preface is refused with a GOAWAY
  that says HTTP/1.1 is required (docs/architecture.md says why).
- ``100 Continue`` is sent when the app first asks for the body, not as soon as the head is in:
  a request the app refuses on its head (a 401) never gets its body invited.
- An answer sent before its request was read whole says ``connection: close`` unless the rest
  is small enough to read and drop after it; a connection that will not be reused is half-closed
  and what the client still sends is read and dropped for a while (nginx's lingering close), so
  the answer reaches a client still sending rather than being lost to a reset.
- The app's receive queue is a small bounded queue (``app_tasks.Inbox``), not a memory channel each.
- Whatever one connection raises is logged once and ends that connection alone.

About 520 lines: one connection's writes, timer and phases are one state machine, read as a whole.
"""

from __future__ import annotations

import contextlib
import enum
import math
from typing import Any, cast

import h11
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h11 import H11WSConnection
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, TaskGroup

from llmgw_shared.logs import get_logger

from .app_tasks import AppReceive, AppSend, AppTasks
from .asgi import REQUEST_ID
from .listener import PEER_GONE, Listener, log_connection_failure, refusal
from .protocol import HTTP2_REFUSAL, Http2Refused, Http11Connection, Http11Protocol

log = get_logger(__name__)

# The most one read takes from the socket: hypercorn's own loop reads 64 KiB (its MAX_RECV), so a
# request arrives in the reads hypercorn's protocol was tuned for.
_MAX_RECV = 2**16
# An answer sent before its request's body was read keeps the connection when the whole body is
# at most this large: it is read (within _DRAIN_SECONDS) and dropped after the answer. A chat
# request is a few KiB; a larger refused upload is not worth reading to save a reconnect.
_DRAIN_BYTES = 1 << 20
_DRAIN_SECONDS = 2.0
# The lingering close: after the last answer what the client still sends is read and dropped,
# until it stops for _LINGER_GAP or for _LINGER_SECONDS in all (nginx's lingering_timeout 5 s and
# lingering_time 30 s), and at most _LINGER_BYTES: a refused upload up to twice the gateway's
# largest body (router.max_body_bytes) is read to its end, so its client sees the answer.
_LINGER_GAP = 5.0
_LINGER_SECONDS = 30.0
_LINGER_BYTES = 64 << 20


class _Phase(enum.Enum):
    """What the connection is waiting for, which says what its one deadline means."""

    HEAD = "head"  # the rest of a request's head, from its first byte
    BODY = "body"  # the rest of a request's body
    BUSY = "busy"  # nothing from the client: its request is in (or it is a WebSocket)
    KEEP_ALIVE = "keep-alive"  # the next request's first byte (or the first request's)
    LINGER = "linger"  # no more answers: what the client still sends is read and dropped


def _is_sized_head(message: Any) -> bool:
    """The head of an answer whose whole body is about to follow: it waits to leave with it.

    A streamed answer's head goes at once (a client may act on the status before the first
    event), but a sized one is of no use without its body.
    """
    if message is None or message["type"] != "http.response.start":
        return False
    return any(name.lower() == b"content-length" for name, _ in message.get("headers", ()))


def _content_length(scope: Any) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def _discard_rest_of_request(receive: AppReceive) -> None:
    """Read and drop what is left of a request (at most ``_DRAIN_BYTES`` by the caller's check)."""
    with trio.move_on_after(_DRAIN_SECONDS):
        while True:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return


class Connection:
    """One accepted connection, served until either side closes it (see the module's docstring).

    ``stream`` is the socket's stream, or the TLS stream over it after its handshake;
    ``first_request_by`` is when the first request must have begun, as the keep-alive timeout
    bounds the wait for each later one (then its head has ``head_timeout`` from its first byte).
    """

    def __init__(
        self,
        app: Any,
        config: Config,
        context: WorkerContext,
        state: dict[str, Any],
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
        listener: Listener,
        *,
        client: tuple[str, int] | None,
        server: tuple[str, int] | None,
        first_request_by: float,
    ) -> None:
        self._app = app
        self._config = config
        self._context = context
        self._state = state
        self._stream = stream
        self._listener = listener
        self._limits = listener.limits
        self._client = client
        self._server = server
        self._tls = isinstance(stream, trio.SSLStream)
        self._send_lock = trio.Lock()
        self._held: list[bytes] = []
        self._holding = 0
        self._write_scope: trio.CancelScope | None = None
        self._protocol: Http11Protocol
        # The one timer (``_watch``): what it waits for, its deadline, and its current scope.
        self._phase = _Phase.KEEP_ALIVE
        self._deadline = first_request_by
        self._timer = trio.CancelScope()
        self._watching = trio.CancelScope()
        self._in_handle = False
        self._body_started = 0.0
        self._body_bytes = 0
        self._linger_ends = 0.0
        self._linger_bytes = 0
        self._gone = False
        # The request being answered, for the request id in a failure's log line.
        self.scope: Any = None

    async def run(self) -> None:
        """Serve the connection; whatever it raises (but cancellation) is logged here and ends it alone."""
        try:
            async with trio.open_nursery() as nursery:
                # A cast: hypercorn's TaskGroup protocol also lists the __aenter__/__aexit__ that
                # only its own loop calls; its protocol classes use spawn_app and spawn.
                tasks = cast(TaskGroup, AppTasks(nursery, self))
                self._protocol = Http11Protocol(
                    self._app,
                    self._config,
                    self._context,
                    tasks,
                    ConnectionState(self._state.copy()),
                    self._tls,
                    self._client,
                    self._server,
                    self._protocol_send,
                )
                nursery.start_soon(self._watch)
                await self._read()
                # The connection is over for the reader; an app may still be answering (a client
                # may half-close after its request), so only the timer ends here.
                self._watching.cancel()
        except* PEER_GONE:
            pass
        except* Exception as failure:
            peer = f"{self._client[0]}:{self._client[1]}" if self._client else "?"
            request_id = self.scope.get(REQUEST_ID) if self.scope is not None else None
            log_connection_failure(failure, listener=self._listener.name, peer=peer, request_id=request_id)
        finally:
            await self._close()

    def expects_continue(self) -> bool:
        connection = self._protocol.connection
        return isinstance(connection, h11.Connection) and connection.client_is_waiting_for_100_continue

    def continuing(self, receive: AppReceive) -> AppReceive:
        """``receive`` that first sends ``100 Continue``: the client sends its body once the app asks for it."""
        invited = False

        async def receive_after_continue() -> Any:
            nonlocal invited
            if not invited:
                invited = True
                connection = self._protocol.connection
                if (
                    not self._gone
                    and not self._lingering()
                    and isinstance(connection, h11.Connection)
                    and connection.client_is_waiting_for_100_continue
                    and connection.our_state is h11.SEND_RESPONSE
                ):
                    self._held.append(
                        connection.send(
                            h11.InformationalResponse(status_code=100, headers=self._config.response_headers("h11"))
                        )
                    )
                    if not self._holding:
                        await self._write_held()
                    # The body's deadline runs from the invitation.
                    self._start_body(trio.current_time())
                    self._arm(_Phase.BODY, self._body_deadline())
            return await receive()

        return receive_after_continue

    def holding_writes(self, send: AppSend, receive: AppReceive, scope: Any) -> AppSend:
        drain = False

        async def forward(message: Any) -> None:
            self._holding += 1
            try:
                await send(message)
            finally:
                self._holding -= 1
            if not self._holding and self._held and not _is_sized_head(message):
                await self._write_held()

        async def send_held(message: Any) -> None:
            nonlocal drain
            if self._gone:
                # The connection is closed: what the app still sends goes nowhere (as uvicorn does),
                # and the app learns of it from receive's disconnect. The checkpoint keeps an app
                # that sends in a loop from starving every other task.
                await trio.lowlevel.checkpoint()
                return
            if message is not None:
                kind = message["type"]
                if kind == "http.response.start" and self._request_unfinished():
                    message, drain = self._early_answer(message, scope)
                elif drain and kind == "http.response.body" and not message.get("more_body", False):
                    # The early answer leaves whole first; then the rest of its (small) request is
                    # read and dropped, and only then does the answer end, so hypercorn keeps the
                    # connection for the next request instead of closing it under the client.
                    drain = False
                    await forward({"type": "http.response.body", "body": message.get("body", b""), "more_body": True})
                    await _discard_rest_of_request(receive)
                    message = {"type": "http.response.body", "body": b"", "more_body": False}
            await forward(message)

        return send_held

    def _request_unfinished(self) -> bool:
        connection = self._protocol.connection
        return type(connection) is Http11Connection and connection.their_state is h11.SEND_BODY

    def _early_answer(self, message: Any, scope: Any) -> tuple[Any, bool]:
        """An answer that starts before its request was read whole: drained after it, or closed.

        Returns the message to send, and whether the rest of the request is then read so that the
        connection can be reused. A client waiting for ``100 Continue`` never sends its body, and a
        large or chunked one is not worth reading: the answer says ``connection: close`` then.
        """
        connection = self._protocol.connection
        length = _content_length(scope)
        if (
            isinstance(connection, h11.Connection)
            and not connection.client_is_waiting_for_100_continue
            and length is not None
            and length <= _DRAIN_BYTES
        ):
            return message, True
        headers = list(message.get("headers", ()))
        if not any(name.lower() == b"connection" and value.lower() == b"close" for name, value in headers):
            headers.append((b"connection", b"close"))
        return {**message, "headers": headers}, False

    def cap_write(self, deadline: float) -> None:
        """The server is stopping: a write in progress ends by ``deadline`` at the latest."""
        scope = self._write_scope
        if scope is not None and scope.deadline > deadline:
            scope.deadline = deadline

    async def _protocol_send(self, event: Event) -> None:
        if isinstance(event, RawData):
            if self._phase is _Phase.LINGER:
                return  # answered for the last time (a 408): nothing more may follow
            self._held.append(event.data)
            if not self._holding:
                await self._write_held()
        elif isinstance(event, Closed):
            # The answer that ends a connection ("connection: close", an error) goes out first.
            await self._write_held()
            await self._end_answers()
            await self._protocol.handle(Closed())
        elif isinstance(event, Updated):
            if self._phase is _Phase.LINGER:
                return
            if event.idle:
                self._arm(_Phase.KEEP_ALIVE, trio.current_time() + self._config.keep_alive_timeout)
            else:
                self._arm(_Phase.BUSY, math.inf)

    def _arm(self, phase: _Phase, deadline: float) -> None:
        self._phase = phase
        if deadline != self._deadline:
            self._deadline = deadline
            self._timer.deadline = deadline

    async def _write_held(self) -> None:
        # The lock keeps writes from two tasks (the app's and the reader's) in order; taken
        # without a scheduler trip when nobody else holds it, which is nearly always.
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            while self._held:
                held, self._held = self._held, []
                data = held[0] if len(held) == 1 else b"".join(held)
                if not data:
                    continue
                deadline = trio.current_time() + self._limits.write_timeout
                cap = self._listener.write_cap
                try:
                    # Shielded as hypercorn does: a cancelled half-written response would leave
                    # the connection's framing broken for the next request. The write's own
                    # deadline still applies: a client that stops reading loses the connection.
                    with trio.CancelScope(shield=True, deadline=cap if cap < deadline else deadline) as scope:
                        self._write_scope = scope
                        await self._stream.send_all(data)
                    self._write_scope = None
                    if not scope.cancelled_caught:
                        continue
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._write_scope = None
                self._held = []
                self._gone = True
                await trio.aclose_forcefully(self._stream)
                await self._protocol.handle(Closed())
                return
        finally:
            self._send_lock.release()

    async def _read(self) -> None:
        stream = self._stream
        protocol = self._protocol
        while True:
            try:
                data = await stream.receive_some(_MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break
            if self._phase is _Phase.LINGER:
                if not data or self._lingered(len(data)):
                    break
                continue
            before = trio.current_time() if self._phase is _Phase.BODY else 0.0
            self._in_handle = True
            try:
                await protocol.handle(RawData(bytes(data)))
            except Http2Refused:
                self._held.append(HTTP2_REFUSAL)
                await self._write_held()
                await self._end_answers()
                continue
            finally:
                self._in_handle = False
            if not data:
                break
            if not self._lingering():  # (handle() may have ended the answers)
                self._after_read(len(data), before)
        await protocol.handle(Closed())

    def _lingering(self) -> bool:
        return self._phase is _Phase.LINGER

    def _after_read(self, size: int, before: float) -> None:
        """Move the timer to what the connection waits for now (usually it already is: no work)."""
        connection = self._protocol.connection
        if type(connection) is not Http11Connection:
            # A WebSocket: hypercorn's pings and the app's own heartbeats time it.
            if self._phase is not _Phase.BUSY:
                self._arm(_Phase.BUSY, math.inf)
            return
        state = connection.their_state
        if state is h11.SEND_BODY:
            if connection.client_is_waiting_for_100_continue:
                return  # the body comes when the app asks for it (``continuing``)
            now = trio.current_time()
            if self._phase is not _Phase.BODY:
                self._start_body(now)
            elif before:
                # Time spent handing the body to an app that was slow to take it is not the client's.
                self._body_started += now - before
            self._body_bytes += size
            self._arm(_Phase.BODY, self._body_deadline())
        elif state is h11.IDLE:
            if self._phase is not _Phase.HEAD and connection.trailing_data[0]:
                self._arm(_Phase.HEAD, trio.current_time() + self._limits.head_timeout)
        elif self._phase is _Phase.BODY:
            self._arm(_Phase.BUSY, math.inf)

    def _start_body(self, now: float) -> None:
        self._body_started = now
        self._body_bytes = 0

    def _body_deadline(self) -> float:
        limits = self._limits
        return self._body_started + limits.body_timeout + self._body_bytes / limits.body_min_rate

    def _lingered(self, size: int) -> bool:
        """Count what a lingering close dropped; True when it has read enough."""
        self._linger_bytes += size
        if self._linger_bytes > _LINGER_BYTES:
            return True
        self._arm(_Phase.LINGER, min(trio.current_time() + _LINGER_GAP, self._linger_ends))
        return False

    def _client_may_send_more(self) -> bool:
        connection = self._protocol.connection
        if type(connection) is not Http11Connection:
            # A WebSocket peer may be sending frames still (or an early frame that was refused).
            return isinstance(connection, H11WSConnection)
        state = connection.their_state
        return state is h11.SEND_BODY or state is h11.ERROR or (state is h11.IDLE and bool(connection.trailing_data[0]))

    async def _end_answers(self) -> None:
        """No more answers on this connection: close it, lingering first if the client may still be sending.

        Closing a socket with unread bytes makes the kernel send a reset, and a client still
        sending its body then loses the answer waiting for it. So the write side is shut (the
        client sees the end of the answer) and what it sends is read and dropped, within bounds.
        """
        if self._phase is _Phase.LINGER:
            return
        if not self._client_may_send_more():
            await self._close()
            return
        if not self._tls:  # TLS has no half-close; the close_notify goes with the close
            async with self._send_lock:
                with contextlib.suppress(*PEER_GONE, trio.BusyResourceError):
                    await cast(trio.SocketStream, self._stream).send_eof()
        now = trio.current_time()
        self._linger_ends = now + _LINGER_SECONDS
        self._arm(_Phase.LINGER, min(now + _LINGER_GAP, self._linger_ends))

    async def _watch(self) -> None:
        """The connection's one timer, and what a server shutdown means for the connection.

        The deadline means what ``_phase`` says: the keep-alive wait, a request's head or body (a
        408 when it passes), or the end of a lingering close. A shutdown closes a connection that
        has no request in progress at once; one with a request is closed after its answer
        (hypercorn does not reuse it). Cancelled through ``_watching`` once the reader is done.
        """
        terminated = self._context.terminated
        with self._watching:
            while True:
                with trio.CancelScope(deadline=self._deadline) as self._timer:
                    if terminated.is_set():
                        await trio.sleep_forever()
                    await terminated.wait()
                if not self._timer.cancelled_caught:
                    if self._phase is _Phase.KEEP_ALIVE or self._phase is _Phase.HEAD:
                        break
                    continue
                if trio.current_time() < self._deadline:
                    continue  # moved on meanwhile
                if not await self._expired():
                    continue
                break
        if self._watching.cancelled_caught:
            return
        with trio.CancelScope(shield=True):
            await self._protocol.handle(Closed())
            await self._close()

    async def _expired(self) -> bool:
        """The deadline passed; True when the connection is to be closed now."""
        phase = self._phase
        if phase is _Phase.BODY and self._in_handle:
            # The reader waits for the app to take the body, which is not the client's delay: the
            # reader sets the deadline again once the app has taken it.
            self._arm(_Phase.BODY, math.inf)
            return False
        if phase is _Phase.HEAD or phase is _Phase.BODY:
            connection = self._protocol.connection
            if isinstance(connection, h11.Connection) and connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                what = "head" if phase is _Phase.HEAD else "body"
                message = (
                    f"The request's {what} did not arrive in time; send it whole, and at least "
                    f"{self._limits.body_min_rate} bytes a second."
                )
                self._held.append(refusal(408, self._listener.error_body(408, "request_timeout", message)))
                await self._write_held()
            await self._end_answers()
            # The app, if one is waiting for the body, learns that the client is gone.
            await self._protocol.handle(Closed())
            return self._phase is not _Phase.LINGER
        return True

    async def _close(self) -> None:
        self._gone = True
        try:
            if not self._tls:
                with contextlib.suppress(*PEER_GONE, trio.BusyResourceError):
                    await cast(trio.SocketStream, self._stream).send_eof()
        finally:
            # Even when cancelled at the checkpoint above: the socket is closed before aclose's own.
            with contextlib.suppress(*PEER_GONE):
                await self._stream.aclose()
