"""The listeners' connection loop: hypercorn's protocols, our writes and keep-alive timing.

Each test serves a small ASGI app with ``serve_asgi`` in the test's own trio loop and talks to it
over a real loopback socket with raw bytes, so it sees exactly what a client would: how the
answer is framed, when the connection closes, and how many writes the server made.
"""

from __future__ import annotations

import socket as stdlib_socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import h11
import httpx2
import pytest
import trio

from llmgw_control.serving import serve_asgi

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
REQUEST = b"POST /v1/x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}"


async def _answer_json(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/early":
        # Answers before the body is read, as a refusal does (a 403 for a missing CSRF token).
        body = b'{"refused": true}'
        await send({"type": "http.response.start", "status": 403, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/slow":
        await trio.sleep(float(scope["query_string"] or b"0"))
    if scope["path"] == "/fail":
        raise RuntimeError("the app broke")
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for part in (b"one", b"two", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b'{"ok": true}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def serving(app: App = _answer_json, **options: Any) -> AsyncIterator[tuple[int, trio.Event]]:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve_asgi, app, "127.0.0.1:0", shutdown=shutdown, grace=5, name="test",
                                          **options))
        yield int(url.rsplit(":", 1)[1]), shutdown
        shutdown.set()


async def _connect(port: int) -> trio.socket.SocketType:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    return sock


async def _read_response(sock: trio.socket.SocketType, conn: h11.Connection) -> tuple[int, bytes]:
    status, body = 0, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await sock.recv(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                conn.start_next_cycle()
            return status, body
        elif isinstance(event, h11.ConnectionClosed):
            raise AssertionError("closed before the answer ended")


def _encode(conn: h11.Connection, path: str) -> bytes:
    return b"".join(conn.send(event) for event in (
        h11.Request(method="POST", target=path, headers=[("host", "t"), ("content-length", "2")]),
        h11.Data(data=b"{}"), h11.EndOfMessage()))


async def _request(sock: trio.socket.SocketType, conn: h11.Connection, path: str = "/v1/x") -> tuple[int, bytes]:
    await sock.send(_encode(conn, path))
    return await _read_response(sock, conn)


async def _closed_by_server(sock: trio.socket.SocketType) -> bool:
    return await sock.recv(1) == b""


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every write the server makes (the tests' clients use plain sockets, not SocketStream)."""
    seen: list[bytes] = []
    original = trio.SocketStream.send_all

    async def counting(self: trio.SocketStream, data: Any) -> None:
        seen.append(bytes(data))
        await original(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", counting)
    return seen


async def test_a_sized_answer_leaves_in_one_write(writes: list[bytes]) -> None:
    async with serving() as (port, _):
        sock = await _connect(port)
        conn = h11.Connection(h11.CLIENT)
        for _ in range(3):  # and so does the next one on the same connection
            writes.clear()
            assert await _request(sock, conn) == (200, b'{"ok": true}')
            assert len(writes) == 1, writes
            assert writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b'{"ok": true}')
        sock.close()


async def test_a_streamed_answer_leaves_as_each_part_is_sent(writes: list[bytes]) -> None:
    async with serving() as (port, _):
        sock = await _connect(port)
        conn = h11.Connection(h11.CLIENT)
        assert await _request(sock, conn, "/stream") == (200, b"onetwothree")
        # Head, three chunks, the chunked terminator: held bytes never wait for a later send.
        assert len(writes) == 5
        assert writes[0].startswith(b"HTTP/1.1 200 ") and b"Transfer-Encoding: chunked" in writes[0]
        assert writes[1:] == [b"3\r\none\r\n", b"3\r\ntwo\r\n", b"5\r\nthree\r\n", b"0\r\n\r\n"]
        sock.close()


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with serving() as (port, _):
        sock = await _connect(port)
        # Both requests in one write; h11 (the client side) only frames, one cycle at a time.
        await sock.send(REQUEST + REQUEST.replace(b"/v1/x", b"/stream"))
        conn = h11.Connection(h11.CLIENT)
        _encode(conn, "/v1/x")
        assert await _read_response(sock, conn) == (200, b'{"ok": true}')
        _encode(conn, "/stream")
        assert await _read_response(sock, conn) == (200, b"onetwothree")
        sock.close()


async def test_an_app_error_is_a_500_and_the_server_goes_on() -> None:
    async with serving() as (port, _):
        sock = await _connect(port)
        conn = h11.Connection(h11.CLIENT)
        status, _body = await _request(sock, conn, "/fail")
        assert status == 500
        assert await _closed_by_server(sock)
        sock = await _connect(port)
        assert await _request(sock, h11.Connection(h11.CLIENT)) == (200, b'{"ok": true}')
        sock.close()


async def test_an_answer_sent_before_the_body_arrived_keeps_the_connection_usable() -> None:
    async with serving() as (port, _):
        sock = await _connect(port)
        await sock.send(b"POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n")
        await trio.sleep(0.1)  # the app has answered by now; the body comes late, as a client may send it
        await sock.send(b"{}" + REQUEST)
        conn = h11.Connection(h11.CLIENT)
        _encode(conn, "/early")
        with trio.fail_after(5):
            assert await _read_response(sock, conn) == (403, b'{"refused": true}')
            _encode(conn, "/v1/x")
            assert await _read_response(sock, conn) == (200, b'{"ok": true}')
        sock.close()


async def test_a_client_that_half_closes_after_its_request_gets_the_answer() -> None:
    async with serving() as (port, _):
        sock = await _connect(port)
        await sock.send(REQUEST.replace(b"/v1/x", b"/slow?0.1"))
        sock.shutdown(stdlib_socket.SHUT_WR)
        received = b""
        while chunk := await sock.recv(65536):
            received += chunk
        assert received.startswith(b"HTTP/1.1 200 ") and received.endswith(b'{"ok": true}')
        sock.close()


async def test_an_idle_connection_is_closed_after_the_keep_alive_timeout() -> None:
    async with serving(keep_alive_timeout=0.3) as (port, _):
        sock = await _connect(port)
        conn = h11.Connection(h11.CLIENT)
        assert (await _request(sock, conn))[0] == 200
        started = trio.current_time()
        with trio.fail_after(5):
            assert await _closed_by_server(sock)
        assert trio.current_time() - started >= 0.25
        sock.close()


async def test_a_connection_that_never_sends_a_request_is_closed_too() -> None:
    async with serving(keep_alive_timeout=0.3) as (port, _):
        sock = await _connect(port)
        with trio.fail_after(5):
            assert await _closed_by_server(sock)
        sock.close()


async def test_a_request_longer_than_the_keep_alive_timeout_is_not_cut() -> None:
    async with serving(keep_alive_timeout=0.2) as (port, _):
        sock = await _connect(port)
        conn = h11.Connection(h11.CLIENT)
        # The timer runs from the end of the previous answer; this one takes three timeouts.
        assert (await _request(sock, conn))[0] == 200
        assert await _request(sock, conn, "/slow?0.6") == (200, b'{"ok": true}')
        assert await _request(sock, conn) == (200, b'{"ok": true}')
        sock.close()


async def test_stopping_closes_idle_connections_at_once_and_answers_busy_ones() -> None:
    async with serving() as (port, shutdown):
        idle = await _connect(port)
        assert (await _request(idle, h11.Connection(h11.CLIENT)))[0] == 200
        busy = await _connect(port)
        await busy.send(REQUEST.replace(b"/v1/x", b"/slow?0.5"))
        await trio.sleep(0.1)
        stopped = trio.current_time()
        shutdown.set()
        with trio.fail_after(2):
            assert await _closed_by_server(idle)
        assert trio.current_time() - stopped < 0.3  # not after the busy one's answer
        received = b""
        with trio.fail_after(5):
            while chunk := await busy.recv(65536):
                received += chunk
        assert received.startswith(b"HTTP/1.1 200 ") and received.endswith(b'{"ok": true}')
        idle.close()
        busy.close()


async def test_http2_with_prior_knowledge_is_served_without_held_writes() -> None:
    # An HTTP/2 send can wait for the peer's flow-control window: holding its bytes would deadlock.
    body = b"x" * 200_000  # beyond the default 64 KiB window

    async def big(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _answer_json(scope, receive, send)
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"200000")]})
        await send({"type": "http.response.body", "body": body})

    async with serving(big) as (port, _), httpx2.AsyncClient(http1=False, http2=True) as client:
        with trio.fail_after(10):
            response = await client.post(f"http://127.0.0.1:{port}/v1/x", content=b"{}")
        assert response.http_version == "HTTP/2"
        assert response.status_code == 200 and response.content == body


async def test_websockets_still_work() -> None:
    from trio_websocket import open_websocket_url

    async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _answer_json(scope, receive, send)
            return
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": message["text"].upper()})

    async with serving(echo) as (port, _), open_websocket_url(f"ws://127.0.0.1:{port}/ws") as ws:
        for word in ("hello", "again"):
            await ws.send_message(word)
            with trio.fail_after(5):
                assert await ws.get_message() == word.upper()



async def test_the_apps_inbox_is_bounded_and_hands_messages_over_in_order() -> None:
    from llmgw_control.http_connection import _Inbox

    inbox = _Inbox(2)
    got: list[int] = []

    async def reader() -> None:
        for _ in range(5):
            got.append(await inbox.get())
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        for i in range(2):
            await inbox.put(i)
        with trio.move_on_after(0.05) as full:
            await inbox.put(99)  # nobody reads yet: the third waits
        assert full.cancelled_caught
        nursery.start_soon(reader)
        for i in range(2, 5):
            await inbox.put(i)
    assert got == [0, 1, 2, 3, 4]


async def test_a_cancelled_caller_of_the_inbox_gets_cancelled_even_with_a_message_waiting() -> None:
    from llmgw_control.http_connection import _Inbox

    inbox = _Inbox(4)
    await inbox.put("body")
    with trio.CancelScope() as scope:
        scope.cancel()
        await inbox.get()
    assert scope.cancelled_caught
    assert await inbox.get() == "body"
