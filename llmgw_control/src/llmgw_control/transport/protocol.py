"""hypercorn's HTTP/1.1 protocol as every listener runs it: HTTP/1.1 (and WebSockets over it) only,
``100 Continue`` left to the connection, and two answers that cross ending the connection.

``Upgrade: h2c`` is ignored and the HTTP/2 preface is refused (``Http2Refused``; the connection
answers with ``HTTP2_REFUSAL``): docs/architecture.md says why. hypercorn is pinned to 0.18.x for
these internals; tests/control/test_hypercorn_contract.py pins each one.
"""

from __future__ import annotations

from typing import Any

import h11
from hypercorn.events import Closed, RawData
from hypercorn.protocol.h11 import H11Protocol, H11WSConnection

from llmgw_shared.logs import get_logger

log = get_logger(__name__)

# The server preface (an empty SETTINGS frame) and a GOAWAY with HTTP_1_1_REQUIRED (RFC 9113
# 9.2.1, error code 0xd), for a client that starts with the HTTP/2 preface: it learns why.
HTTP2_REFUSAL = (
    b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + (0).to_bytes(4, "big") + (0xD).to_bytes(4, "big")
)


class Http2Refused(Exception):
    """The client began with the HTTP/2 preface, which no listener serves."""


class Http11Connection(h11.Connection):
    """h11's connection, with hypercorn's automatic ``100 Continue`` turned off.

    hypercorn sends ``100 Continue`` whenever this property is true, which it is as soon as the
    head of an ``Expect: 100-continue`` request is parsed: before the app has looked at it. The
    connection sends it instead when the app first asks for the body (``Connection.continuing``).
    """

    @property
    def they_are_waiting_for_100_continue(self) -> bool:
        return False


class Http11Protocol(H11Protocol):
    """hypercorn's HTTP/1.1 protocol, offering HTTP/1.1 (and WebSockets over it) and nothing else."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.connection = Http11Connection(h11.SERVER, max_incomplete_event_size=self.config.h11_max_incomplete_size)
        self._crossed = False

    async def _send_h11_event(self, event: Any) -> None:
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError as error:
            if getattr(self.connection, "their_state", None) is h11.ERROR:
                return  # as hypercorn does: the answer to a request h11 could not parse is already out
            # Two answers to one request crossed: hypercorn answers 400 itself to WebSocket frames
            # sent before the handshake's answer, while the app refuses the same handshake. The
            # framing is lost, so the connection ends here (hypercorn raised, into the app and
            # out of the connection).
            if not self._crossed:
                self._crossed = True
                log.warning("two answers to one request crossed (%s); the connection is closed", error)
            await self.send(Closed())
            return
        await self.send(RawData(data=data))
        if type(event) is h11.EndOfMessage and isinstance(self.connection, H11WSConnection):
            # A WebSocket handshake answered in HTTP (refused): hypercorn does not end the stream
            # after every such answer (not after its 400 for early frames), which left the
            # connection open for as long as the client kept it. It ends here.
            await self.send(Closed())

    async def _check_protocol(self, event: h11.Request) -> None:
        # hypercorn answers "Upgrade: h2c" with a 101 and switches to HTTP/2, and takes the HTTP/2
        # preface as prior knowledge. An upgrade is ignored here (RFC 9110 7.8: a server may), so
        # the request is answered in HTTP/1.1; the preface is refused by the connection.
        if event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            raise Http2Refused()
