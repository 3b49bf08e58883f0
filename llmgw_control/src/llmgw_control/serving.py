"""Serving an ASGI app with hypercorn's protocols, inside the caller's nursery.

hypercorn's ``serve`` is not used: its per-connection loop costs the data path more than the
protocol work does (see ``http_connection``). This is the rest of what ``serve`` does -- bind,
the app's lifespan, accept, and a graceful stop -- around our connection loop.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import repr_socket_addr, wrap_app

from llmgw_shared.logs import get_logger

from .http_connection import Connection

log = get_logger("llmgw.serving")


async def serve_asgi(
    app: Any, address: str, *, shutdown: trio.Event, grace: float, name: str,
    websocket_max_message_size: int | None = None, keep_alive_timeout: float = 75.0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown`` is set; in-flight requests then get ``grace`` seconds to finish.

    No signal handlers are installed here: the caller owns SIGTERM.
    """
    config = HypercornConfig()
    config.bind = [address]
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
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            sockets = config.create_sockets().insecure_sockets
            for sock in sockets:
                sock.listen(config.backlog)
            listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]
            url = f"http://{repr_socket_addr(sockets[0].family, sockets[0].getsockname())}"
            log.info("%s listening on %s", name, url, extra={"listener": name, "url": url})
            task_status.started(url)
            async with trio.open_nursery() as accepting:
                accepting.start_soon(partial(
                    trio.serve_listeners, partial(_serve_connection, wrapped, config, context, state), listeners,
                    handler_nursery=connections))
                await shutdown.wait()
                accepting.cancel_scope.cancel()
            # Idle keep-alive connections close now; requests in progress get the grace period.
            await context.terminated.set()
            connections.cancel_scope.deadline = trio.current_time() + grace
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def _serve_connection(app: Any, config: HypercornConfig, context: WorkerContext, state: dict[str, Any],
                            stream: trio.SocketStream) -> None:
    await Connection(app, config, context, state, stream).run()
