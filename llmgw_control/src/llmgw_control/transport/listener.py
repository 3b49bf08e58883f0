"""One listener's connections (how many are open, their limits, the cap a shutdown puts on writes),
and what every connection loop shares: which failures mean the peer left, the answers a connection
makes itself (408, 503) outside h11, and the one log line for a connection that failed."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from llmgw_shared.logs import get_logger

from .config import ListenersConfig

if TYPE_CHECKING:
    from .connection import Connection

log = get_logger(__name__)

# Peers that vanish (a reset, a closed socket) end their connection quietly: not an error of ours.
PEER_GONE = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)

# (status, code, message) -> the JSON body of an answer the connection itself makes (408, 503), in
# the listener's own error shape.
ErrorBody = Callable[[int, str, str], bytes]

_REASONS = {408: b"Request Timeout", 503: b"Service Unavailable"}


def refusal(status: int, body: bytes, *extra: tuple[bytes, bytes]) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, for answers made outside h11 (408, 503)."""
    head = [
        b"HTTP/1.1 %d %s" % (status, _REASONS[status]),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
        *(name + b": " + value for name, value in extra),
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def log_connection_failure(failure: BaseException, *, listener: str, peer: str, request_id: str | None) -> None:
    """One line, with the traceback, for whatever ended a connection that was not the peer leaving."""
    while isinstance(failure, BaseExceptionGroup) and len(failure.exceptions) == 1:
        failure = failure.exceptions[0]  # the nursery's wrapping says nothing
    fields: dict[str, Any] = {"listener": listener, "peer": peer}
    if request_id is not None:
        fields["request_id"] = request_id
    log.error(
        "a connection on the %s listener failed and was closed: %r", listener, failure, exc_info=failure, extra=fields
    )


class Listener:
    """One listener's connections: how many are open, their limits, and the cap a shutdown puts on writes."""

    def __init__(self, name: str, limits: ListenersConfig, error_body: ErrorBody) -> None:
        self.name = name
        self.limits = limits
        self.error_body = error_body
        # Connections counted against max_connections (from the accept, a TLS handshake included),
        # and those being served, whose writes a shutdown caps.
        self.count = 0
        self.open: set[Connection] = set()
        # Refusals in progress (a 503 being written and lingered on), bounded apart from ``count``;
        # refusals since the last warning about them, and when that was.
        self.refusing = 0
        self.refused = 0
        self.refusals_logged_at = -math.inf
        # Finite once the server stops: no write outlives the grace period.
        self.write_cap = math.inf

    def cap_writes(self, deadline: float) -> None:
        self.write_cap = deadline
        for connection in self.open:
            connection.cap_write(deadline)
