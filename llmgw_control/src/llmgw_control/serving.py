"""Running an ASGI app on hypercorn's trio worker, inside the caller's nursery."""

from __future__ import annotations

import logging
from typing import Any

import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig

from llmgw_shared.logs import get_logger

log = get_logger("llmgw.serving")


async def serve_asgi(
    app: Any, address: str, *, shutdown: trio.Event, grace: float, name: str,
    websocket_max_message_size: int | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown`` is set; in-flight requests then get ``grace`` seconds to finish.

    Hypercorn installs no signal handlers when run this way: the caller owns SIGTERM.
    """
    config = HypercornConfig()
    config.bind = [address]
    config.graceful_timeout = grace
    # Clients of an LLM gateway reuse connections between long requests; 5 s (the default)
    # made them reconnect after every pause.
    config.keep_alive_timeout = 75
    config.backlog = 1024
    config.accesslog = None
    # Route hypercorn's own messages through our handler instead of a second one of its own.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.include_server_header = False
    if websocket_max_message_size is not None:
        config.websocket_max_message_size = websocket_max_message_size
    # Quart would cut bodies at 60 s; hypercorn's own limits stay at their defaults.
    await hypercorn.trio.serve(app, config, shutdown_trigger=shutdown.wait, task_status=_first_bind(task_status, name))


class _first_bind:
    """Hand the caller the one URL we bound instead of hypercorn's list of them."""

    def __init__(self, task_status: trio.TaskStatus[str], name: str) -> None:
        self._task_status = task_status
        self._name = name

    def started(self, binds: list[str] | None = None) -> None:
        url = binds[0] if binds else ""
        log.info("%s listening on %s", self._name, url, extra={"listener": self._name, "url": url})
        self._task_status.started(url)
