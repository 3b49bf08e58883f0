"""The hypercorn internals our connection loop (transport/connection.py) relies on, pinned.

The loop drives hypercorn's HTTP/1.1 protocol class directly, not through hypercorn's own
server, so it depends on names and behaviour hypercorn does not promise to keep. Each test
here states one of them; an upgrade that changes one fails here by name instead of somewhere
strange under traffic. (pyproject pins hypercorn to 0.18.x for the same reason.)
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from typing import Any

import h11
import pytest
import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.events import Closed, RawData, Updated
from hypercorn.protocol.h11 import H2CProtocolRequiredError, H11Protocol, H11WSConnection
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from llmgw_control.transport.protocol import Http2Refused, Http11Connection, Http11Protocol


def test_the_pinned_release() -> None:
    assert version("hypercorn").startswith("0.18."), "re-check every test in this file, then move the pin"


def test_the_protocol_class_is_built_as_the_loop_builds_it() -> None:
    params = list(inspect.signature(H11Protocol.__init__).parameters)
    assert params == [
        "self",
        "app",
        "config",
        "context",
        "task_group",
        "connection_state",
        "ssl",
        "client",
        "server",
        "send",
    ]
    # The override points the loop replaces.
    for name in ("_check_protocol", "_handle_events", "_send_h11_event", "handle", "stream_send"):
        assert inspect.iscoroutinefunction(getattr(H11Protocol, name)), name
    for name in ("_check_protocol", "_send_h11_event"):
        assert list(inspect.signature(getattr(H11Protocol, name)).parameters) == ["self", "event"], name
    # Every answer hypercorn frames goes through _send_h11_event (the override's premise).
    assert "_send_h11_event" in inspect.getsource(H11Protocol.stream_send)


class _Tasks:
    """The TaskGroup surface hypercorn's protocol uses: spawn_app (returning the app's put) and spawn."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.scopes: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []

    async def spawn_app(self, app: Any, config: Config, scope: Any, send: Any) -> Any:
        self.scopes.append(scope)

        async def answer() -> None:
            if scope["type"] != "http":
                return
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            await send(None)

        self.nursery.start_soon(answer)

        async def put(message: dict[str, Any]) -> None:
            self.received.append(message)

        return put

    def spawn(self, func: Any, *args: Any) -> None:
        self.nursery.start_soon(func, *args)


async def _drive(
    data: bytes, protocol_class: type[H11Protocol] = Http11Protocol, connection: type[h11.Connection] | None = None
) -> tuple[list[Any], _Tasks, H11Protocol]:
    events: list[Any] = []

    async def send(event: Any) -> None:
        events.append(event)

    config = Config()
    async with trio.open_nursery() as nursery:
        tasks = _Tasks(nursery)
        protocol = protocol_class(
            None,
            config,
            WorkerContext(None),
            tasks,
            ConnectionState({}),
            False,
            ("127.0.0.1", 1),
            ("127.0.0.1", 2),
            send,
        )
        if connection is not None:
            protocol.connection = connection(h11.SERVER)
        await protocol.handle(RawData(data))
        await trio.testing.wait_all_tasks_blocked()  # what the data started has run as far as it can
    return events, tasks, protocol


async def test_events_the_loop_times_connections_by() -> None:
    events, tasks, protocol = await _drive(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
    kinds = [type(e) for e in events]
    # A request's head: Updated(idle=False); its answer: RawData; the connection reusable: Updated(idle=True).
    assert kinds[0] is Updated and events[0].idle is False
    answer = b"".join(e.data for e in events if isinstance(e, RawData))
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok")
    assert isinstance(events[-1], Updated) and events[-1].idle is True
    assert tasks.scopes[0]["path"] == "/x" and tasks.scopes[0]["scheme"] == "http"
    # The loop reads h11's states through this attribute, our subclass in place.
    assert type(protocol.connection) is Http11Connection
    assert protocol.connection.their_state is h11.IDLE and protocol.connection.our_state is h11.IDLE


async def test_an_answer_with_connection_close_ends_in_closed() -> None:
    events, _, _ = await _drive(b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
    assert isinstance(events[-1], Closed)


async def test_100_continue_is_sent_by_hypercorn_exactly_when_h11_says_the_client_waits() -> None:
    head = b"POST /x HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n"
    stock, _, _ = await _drive(head, H11Protocol)
    assert b"".join(e.data for e in stock if isinstance(e, RawData)).startswith(b"HTTP/1.1 100 ")
    ours, _, protocol = await _drive(head)
    assert not b"".join(e.data for e in ours if isinstance(e, RawData)).startswith(b"HTTP/1.1 100 ")
    # What the loop reads instead, to send it when the app asks for the body.
    assert isinstance(protocol.connection, h11.Connection)


async def test_h2c_is_hypercorns_upgrade_and_our_override_declines_it() -> None:
    head = (
        b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\n"
        b"http2-settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
    )
    with pytest.RaisesGroup(H2CProtocolRequiredError, allow_unwrapped=True, flatten_subgroups=True):
        await _drive(head, H11Protocol)
    events, _, _ = await _drive(head)
    answer = b"".join(e.data for e in events if isinstance(e, RawData))
    assert answer.startswith(b"HTTP/1.1 200 ")


async def test_the_http2_preface_reaches_our_check() -> None:
    with pytest.RaisesGroup(Http2Refused, allow_unwrapped=True, flatten_subgroups=True):
        await _drive(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")


async def test_a_websocket_upgrade_replaces_the_h11_connection() -> None:
    # The loop tells HTTP from WebSocket by the type of protocol.connection.
    _, _, protocol = await _drive(
        b"GET /ws HTTP/1.1\r\nhost: t\r\nconnection: Upgrade\r\nupgrade: websocket\r\n"
        b"sec-websocket-key: MDEyMzQ1Njc4OWFiY2RlZg==\r\nsec-websocket-version: 13\r\n\r\n"
    )
    assert isinstance(protocol.connection, H11WSConnection)


def test_the_config_and_context_attributes_the_loop_reads() -> None:
    config = Config()
    for name in ("h11_max_incomplete_size", "keep_alive_timeout", "max_app_queue_size", "keep_alive_max_requests"):
        assert hasattr(config, name), name
    assert isinstance(config.response_headers("h11"), list)
    context = WorkerContext(None)
    assert hasattr(context.terminated, "is_set") and inspect.iscoroutinefunction(context.terminated.wait)
    assert inspect.iscoroutinefunction(context.terminated.set)
    from hypercorn.trio.lifespan import Lifespan  # noqa: F401
    from hypercorn.utils import parse_socket_addr, repr_socket_addr, wrap_app  # noqa: F401 -- serving.py's imports
