"""The app's side of a connection: the task an ASGI app runs in, and the queue it receives from.

hypercorn's protocol spawns the app through a task group (``AppTasks``); its ``send`` is wrapped
by the connection so that writes are held and leave together (``Connection.holding_writes``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.config import Config

from llmgw_shared.logs import get_logger
from llmgw_shared.threads import APP

from .asgi import REQUEST_ID

if TYPE_CHECKING:
    from .connection import Connection

log = get_logger(__name__)

AppSend = Callable[[Any], Awaitable[None]]
AppReceive = Callable[[], Awaitable[Any]]


async def run_app(app: Any, config: Config, scope: Any, receive: AppReceive, send: AppSend, inbox: Inbox) -> None:
    """The app's task: an error it raises is logged and answered (a 500 if nothing was sent yet)."""
    try:
        try:
            await app(scope, receive, send, APP.run, trio.from_thread.run)
        except trio.Cancelled:
            raise
        except BaseExceptionGroup as error:
            if error.split(trio.Cancelled)[1] is None:
                raise
            log.error("the app failed", exc_info=error, extra=_request_fields(scope))
        except Exception as error:
            log.error("the app failed", exc_info=error, extra=_request_fields(scope))
        finally:
            # "The app is done": hypercorn answers 500 if it never started a response, and ends the stream.
            await send(None)
    finally:
        # Nobody reads the body any more: a reader waiting to hand it over must not wait forever.
        inbox.close()


def _request_fields(scope: Any) -> dict[str, Any]:
    request_id = scope.get(REQUEST_ID)
    return {"request_id": request_id} if request_id else {}


class Inbox:
    """The app's receive queue: what a trio memory channel did here, for less.

    One is made per request and carries two or three messages (the body, its end, the
    disconnect). The channel's setup was measurable per request (docs/performance.md), and each send and receive
    was a trip through the scheduler even when the other side was already waiting. Bounded as
    the channel was (``max_app_queue_size``), so an app that stops reading slows the reader of
    its connection rather than growing the queue; a cancelled caller still gets ``Cancelled``.
    The disconnect is never held back by the bound (it is the last message, and an app that
    answered without reading must still learn of it), and once the app is done (``close``),
    what is put is dropped.
    """

    __slots__ = ("_changed", "_closed", "_items", "_limit")

    def __init__(self, limit: int) -> None:
        self._items: deque[Any] = deque()
        self._limit = limit
        self._changed: trio.Event | None = None
        self._closed = False

    async def put(self, message: Any) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._items) >= self._limit and not self._closed and message["type"] != "http.disconnect":
            await self._wait()
        if self._closed:
            return
        self._items.append(message)
        self._notify()

    async def get(self) -> Any:
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._items:
            await self._wait()
        message = self._items.popleft()
        self._notify()
        return message

    def close(self) -> None:
        self._closed = True
        self._items.clear()
        self._notify()

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


class AppTasks:
    """What hypercorn's protocol uses of a task group, with the app's ``send`` holding writes."""

    def __init__(self, nursery: trio.Nursery, connection: Connection) -> None:
        self._nursery = nursery
        self._connection = connection

    async def spawn_app(self, app: Any, config: Config, scope: Any, send: AppSend) -> AppSend:
        connection = self._connection
        inbox = Inbox(config.max_app_queue_size)
        receive: AppReceive = inbox.get
        if connection.expects_continue():
            receive = connection.continuing(receive)
        connection.scope = scope
        held_send = connection.holding_writes(send, inbox.get, scope)
        self._nursery.start_soon(run_app, app, config, scope, receive, held_send, inbox)
        return inbox.put

    def spawn(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None:
        self._nursery.start_soon(func, *args)
