"""Reading one HTTP/1.1 request with h11, for the small servers tests start (the OTLP receiver, the
OIDC provider): each answers in its own way, but reads a request the same way."""

from __future__ import annotations

import h11
import trio


async def read_request(connection: h11.Connection, stream: trio.SocketStream) -> tuple[h11.Request, bytes] | None:
    """The next request's head and whole body; None when the peer closed or h11 saw no request."""
    head: h11.Request | None = None
    body = b""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            if not data:
                return None
            connection.receive_data(data)
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return (head, body) if head is not None else None
        else:
            return None
