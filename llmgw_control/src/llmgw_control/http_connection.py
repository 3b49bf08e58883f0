"""One client connection: hypercorn's HTTP protocols driven by a connection loop of our own.

hypercorn's own loop (``hypercorn.trio.tcp_server.TCPServer``) cost a proxied request more than
hypercorn's protocol work did. Every HTTP/1.1 response left in three socket writes (head, body,
and an empty write for the end of a sized body), each behind a lock and each a trip through
trio's scheduler; every write woke the client once more. And between two requests on a
keep-alive connection it started a new task for the idle timer (``nursery.start``, which waits
for the task to run) and cancelled it again at the next request. At concurrency 1 every one of
those scheduler trips is on the request's path.

Here the parsing, the ASGI scope and the HTTP semantics stay hypercorn's (``ProtocolWrapper``:
h11, h2c, WebSockets); what changes is how its output reaches the socket and how idleness is
timed:

- While the app is inside an ASGI ``send`` on an HTTP/1.1 connection, the bytes hypercorn writes
  are held and leave as one write when that ``send`` returns, or with the body when it was the
  head of a sized answer: a whole JSON answer is one ``send()`` call, and so is each relayed SSE
  batch. HTTP/2 is written through at once: its sends can wait for the peer's flow-control
  window, which must not wait behind held bytes.
- One task per connection times the keep-alive, and requests only move its deadline.
- The app's receive queue is a small bounded queue (``_Inbox``), not a memory channel each.
- An answer that ends before its request has arrived whole first reads the rest (bounded), so
  the connection stays usable instead of being closed under a client that reuses it.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import h11
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, TaskGroup
from hypercorn.utils import parse_socket_addr

_MAX_RECV = 2**16
_DISCARD_BYTES = 1 << 20
_DISCARD_SECONDS = 2.0

AppSend = Callable[[Any], Awaitable[None]]


async def _run_app(app: Any, config: Config, scope: Any, receive: Callable[[], Awaitable[Any]],
                   send: AppSend) -> None:
    """The app's task: an error it raises is logged and answered (a 500 if nothing was sent yet)."""
    try:
        await app(scope, receive, send, trio.to_thread.run_sync, trio.from_thread.run)
    except trio.Cancelled:
        raise
    except BaseExceptionGroup as error:
        if error.split(trio.Cancelled)[1] is None:
            raise
        await config.log.exception("Error in ASGI Framework")
    except Exception:
        await config.log.exception("Error in ASGI Framework")
    finally:
        # "The app is done": hypercorn answers 500 if it never started a response, and ends the stream.
        await send(None)


def _is_sized_head(message: Any) -> bool:
    """The head of an answer whose whole body is about to follow: it waits to leave with it.

    A streamed answer's head goes at once (a client may act on the status before the first
    event), but a sized one is of no use without its body.
    """
    if message is None or message["type"] != "http.response.start":
        return False
    return any(name.lower() == b"content-length" for name, _ in message.get("headers", ()))


def _ends_answer(message: Any) -> bool:
    return message is None or (message["type"] == "http.response.body" and not message.get("more_body", False))


def _request_unfinished(protocol: H11Protocol) -> bool:
    connection = protocol.connection
    return (isinstance(connection, h11.Connection) and connection.their_state is h11.SEND_BODY
            and not connection.they_are_waiting_for_100_continue)


async def _discard_rest_of_request(receive: Callable[[], Awaitable[Any]]) -> None:
    """Read what is left of a request the app answered without reading it all.

    hypercorn closes a connection whose answer ends before its request, without saying so in
    the answer: a client reusing the connection then loses its next request ("server
    disconnected"). That happened to 403s sent before the body was read. Within a small bound
    the rest is read here, so the connection stays usable; beyond it, it is closed as before.
    """
    size = 0
    with trio.move_on_after(_DISCARD_SECONDS):
        while size <= _DISCARD_BYTES:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            size += len(message.get("body", b""))


class _Inbox:
    """The app's receive queue: what a trio memory channel did here, for less.

    One is made per request and carries two or three messages (the body, its end, the
    disconnect). The channel's setup cost a twentieth of a request, and each send and receive
    was a trip through the scheduler even when the other side was already waiting. Bounded as
    the channel was (``max_app_queue_size``), so an app that stops reading slows the reader of
    its connection rather than growing the queue; a cancelled caller still gets ``Cancelled``.
    """

    __slots__ = ("_changed", "_items", "_limit")

    def __init__(self, limit: int) -> None:
        self._items: deque[Any] = deque()
        self._limit = limit
        self._changed: trio.Event | None = None

    async def put(self, message: Any) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._items) >= self._limit:
            await self._wait()
        self._items.append(message)
        self._notify()

    async def get(self) -> Any:
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._items:
            await self._wait()
        message = self._items.popleft()
        self._notify()
        return message

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


class _AppTasks:
    """What hypercorn's protocols use of a task group, with the app's ``send`` holding writes."""

    def __init__(self, nursery: trio.Nursery, connection: Connection) -> None:
        self._nursery = nursery
        self._connection = connection

    async def spawn_app(self, app: Any, config: Config, scope: Any, send: AppSend) -> AppSend:
        inbox = _Inbox(config.max_app_queue_size)
        held_send = self._connection.holding_writes(send, inbox.get)
        self._nursery.start_soon(_run_app, app, config, scope, inbox.get, held_send)
        return inbox.put

    def spawn(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None:
        self._nursery.start_soon(func, *args)


class Connection:
    """One accepted TCP connection, served until either side closes it (see the module's docstring)."""

    def __init__(self, app: Any, config: Config, context: WorkerContext, state: dict[str, Any],
                 stream: trio.SocketStream) -> None:
        self._app = app
        self._config = config
        self._context = context
        self._state = state
        self._stream = stream
        self._send_lock = trio.Lock()
        self._held: list[bytes] = []
        self._holding = 0
        self._protocol: ProtocolWrapper
        self._busy = False
        self._idle_scope = trio.CancelScope()
        self._watching = trio.CancelScope()
        self._became_idle = trio.Event()

    async def run(self) -> None:
        try:
            socket = self._stream.socket
            client = parse_socket_addr(socket.family, socket.getpeername())
            server = parse_socket_addr(socket.family, socket.getsockname())
            async with trio.open_nursery() as nursery:
                # A cast: hypercorn's TaskGroup protocol also lists the __aenter__/__aexit__ that
                # only its own loop calls; its protocol classes use spawn_app and spawn.
                tasks = cast(TaskGroup, _AppTasks(nursery, self))
                self._protocol = ProtocolWrapper(
                    self._app, self._config, self._context, tasks,
                    ConnectionState(self._state.copy()), False, client, server, self._protocol_send, "http/1.1")
                await self._protocol.initiate()
                self._idle_scope.deadline = trio.current_time() + self._config.keep_alive_timeout
                nursery.start_soon(self._close_when_idle)
                await self._read()
                # The connection is over for the reader; an app may still be answering (a client
                # may half-close after its request), so only the idle watch ends here.
                self._watching.cancel()
        except OSError:
            pass
        finally:
            await self._close()

    def holding_writes(self, send: AppSend, receive: Callable[[], Awaitable[Any]]) -> AppSend:
        async def send_held(message: Any) -> None:
            protocol = self._protocol.protocol
            if type(protocol) is not H11Protocol:
                await send(message)
                return
            if _ends_answer(message) and _request_unfinished(protocol):
                await _discard_rest_of_request(receive)
            self._holding += 1
            try:
                await send(message)
            finally:
                self._holding -= 1
            if not self._holding and self._held and not _is_sized_head(message):
                await self._write_held()
        return send_held

    async def _protocol_send(self, event: Event) -> None:
        if isinstance(event, RawData):
            self._held.append(event.data)
            if not self._holding:
                await self._write_held()
        elif isinstance(event, Closed):
            # The answer that ends a connection ("connection: close", an error) goes out first.
            await self._write_held()
            await self._close()
            await self._protocol.handle(Closed())
        elif isinstance(event, Updated):
            self._busy = not event.idle
            if event.idle:
                self._idle_scope.deadline = trio.current_time() + self._config.keep_alive_timeout
                self._became_idle.set()
            else:
                self._idle_scope.deadline = math.inf
                self._became_idle = trio.Event()

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
                try:
                    # Shielded as hypercorn does: a cancelled half-written response would leave
                    # the connection's framing broken for the next request.
                    with trio.CancelScope(shield=True):
                        await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._held = []
                    await self._protocol.handle(Closed())
                    return
        finally:
            self._send_lock.release()

    async def _read(self) -> None:
        timeout = self._config.read_timeout
        while True:
            try:
                if timeout is None:
                    data = await self._stream.receive_some(_MAX_RECV)
                else:
                    with trio.fail_after(timeout):
                        data = await self._stream.receive_some(_MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                break
            await self._protocol.handle(RawData(bytes(data)))
            if not data:
                break
        await self._protocol.handle(Closed())

    async def _close_when_idle(self) -> None:
        """Close the connection after ``keep_alive_timeout`` idle, or once idle when the server stops.

        The scope's deadline is finite only while no request is in progress (``Updated`` events
        move it), so a long stream is never cut for idleness.
        """
        with self._watching:
            with self._idle_scope:
                await self._context.terminated.wait()
            while self._busy:
                await self._became_idle.wait()
        if self._watching.cancelled_caught:
            return
        with trio.CancelScope(shield=True):
            await self._protocol.handle(Closed())
            await self._stream.aclose()

    async def _close(self) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError):
            await self._stream.send_eof()
        await self._stream.aclose()
