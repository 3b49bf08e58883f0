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
import trio.testing

from llmgw_control.transport.serving import serve_asgi
from support.waiting import wait_until

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
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def serving(app: App = _answer_json, **options: Any) -> AsyncIterator[tuple[int, trio.Event]]:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            partial(serve_asgi, app, "127.0.0.1:0", shutdown=shutdown, grace=5, name="test", **options)
        )
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
    return b"".join(
        conn.send(event)
        for event in (
            h11.Request(method="POST", target=path, headers=[("host", "t"), ("content-length", "2")]),
            h11.Data(data=b"{}"),
            h11.EndOfMessage(),
        )
    )


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
    answered = trio.Event()

    async def early(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def answering(message: Any) -> None:
            if message["type"] == "http.response.body":
                # The app has answered; its last send is held until the late body is read and dropped.
                answered.set()
            await send(message)

        await _answer_json(scope, receive, answering if scope["type"] == "http" else send)

    async with serving(early) as (port, _):
        sock = await _connect(port)
        await sock.send(b"POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n")
        with trio.fail_after(5):
            await answered.wait()  # the app has answered; the body comes late, as a client may send it
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
    busy_in_app = trio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/slow":
            busy_in_app.set()
        await _answer_json(scope, receive, send)

    async with serving(app) as (port, shutdown):
        idle = await _connect(port)
        assert (await _request(idle, h11.Connection(h11.CLIENT)))[0] == 200
        busy = await _connect(port)
        await busy.send(REQUEST.replace(b"/v1/x", b"/slow?0.5"))
        with trio.fail_after(5):
            await busy_in_app.wait()  # the busy one is being served when the stop comes
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


async def test_http2_with_prior_knowledge_is_refused_with_http_1_1_required() -> None:
    # No listener offers HTTP/2 (docs/architecture.md): a client that starts with its preface is
    # told so in its own protocol (GOAWAY, HTTP_1_1_REQUIRED), and the server goes on.
    async with serving() as (port, _):
        async with httpx2.AsyncClient(http1=False, http2=True) as client:
            with trio.fail_after(10), pytest.raises(httpx2.RemoteProtocolError, match="error_code:13"):
                await client.post(f"http://127.0.0.1:{port}/v1/x", content=b"{}")
        sock = await _connect(port)
        assert await _request(sock, h11.Connection(h11.CLIENT)) == (200, b'{"ok": true}')
        sock.close()


async def test_an_h2c_upgrade_is_ignored_and_answered_in_http_1_1() -> None:
    async with serving() as (port, _):
        sock = await _connect(port)
        await sock.send(
            b"GET /v1/x HTTP/1.1\r\nhost: t\r\nconnection: Upgrade, HTTP2-Settings\r\n"
            b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
        )
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="GET", target="/v1/x", headers=[("host", "t")]))
        conn.send(h11.EndOfMessage())
        with trio.fail_after(5):
            assert await _read_response(sock, conn) == (200, b'{"ok": true}')
        sock.close()


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
    from llmgw_control.transport.app_tasks import Inbox as _Inbox

    inbox = _Inbox(2)
    got: list[int] = []

    def body(n: int) -> dict[str, Any]:
        return {"type": "http.request", "n": n}

    async def reader() -> None:
        for _ in range(5):
            got.append((await inbox.get())["n"])
            await trio.sleep(0.01)  # a slow reader: the writer must wait for it (the behaviour under test)

    async with trio.open_nursery() as nursery:
        for i in range(2):
            await inbox.put(body(i))
        with trio.move_on_after(0.05) as full:
            await inbox.put(body(99))  # nobody reads yet: the third waits
        assert full.cancelled_caught
        nursery.start_soon(reader)
        for i in range(2, 5):
            await inbox.put(body(i))
    assert got == [0, 1, 2, 3, 4]


async def test_the_inbox_never_holds_back_the_disconnect_and_drops_everything_once_closed() -> None:
    from llmgw_control.transport.app_tasks import Inbox as _Inbox

    inbox = _Inbox(1)
    await inbox.put({"type": "http.request", "more_body": True})
    with trio.fail_after(1):
        # Full, but an app that answered without reading must still learn that the client left.
        await inbox.put({"type": "http.disconnect"})
        inbox.close()
        # The app is done: a reader handing over more body is not left waiting forever.
        await inbox.put({"type": "http.request", "more_body": True})
        await inbox.put({"type": "http.request", "more_body": True})


async def test_a_cancelled_caller_of_the_inbox_gets_cancelled_even_with_a_message_waiting() -> None:
    from llmgw_control.transport.app_tasks import Inbox as _Inbox

    inbox = _Inbox(4)
    await inbox.put({"type": "http.request"})
    with trio.CancelScope() as scope:
        scope.cancel()
        await inbox.get()
    assert scope.cancelled_caught
    assert await inbox.get() == {"type": "http.request"}


# --- One connection cannot stop a listener -------------------------------------------------------


async def test_an_h2c_upgrade_with_malformed_settings_ends_no_listener() -> None:
    # Issue 13's crash: a 101 was sent, then h2 raised binascii.Error out of the connection and
    # out of the listener, and the daemon exited. Every variant of the settings header is fine now.
    async with serving() as (port, _):
        for settings in (b"A", b"!!!!", b"AAAA" * 5000, b"", b"\xff\xfe"):
            sock = await _connect(port)
            await sock.send(
                b"GET /v1/x HTTP/1.1\r\nhost: t\r\nconnection: Upgrade, HTTP2-Settings\r\n"
                b"upgrade: h2c\r\nhttp2-settings: " + settings + b"\r\n\r\n"
            )
            with trio.fail_after(5):
                received = await sock.recv(65536)
            assert not received.startswith(b"HTTP/1.1 101"), received
            sock.close()
        sock = await _connect(port)
        assert await _request(sock, h11.Connection(h11.CLIENT)) == (200, b'{"ok": true}')
        sock.close()


async def test_whatever_one_connection_raises_is_logged_once_and_ends_it_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Fault injection: hypercorn itself fails while finishing a request's answer, outside the app
    # (as h2 did on a malformed HTTP2-Settings), on the one request that asks for it.
    from hypercorn.protocol.http_stream import HTTPStream

    from llmgw_control.transport.asgi import REQUEST_ID

    original = HTTPStream.app_send

    async def failing(self: HTTPStream, message: Any) -> None:
        if message is None and self.scope["path"] == "/boom":
            raise RuntimeError("hypercorn broke")
        await original(self, message)

    monkeypatch.setattr(HTTPStream, "app_send", failing)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope[REQUEST_ID] = "req-42"  # as the gateway records its request id
        await _answer_json(scope, receive, send)

    async with serving(app) as (port, _):
        broken = await _connect(port)
        await broken.send(REQUEST.replace(b"/v1/x", b"/boom"))
        with trio.fail_after(5):
            while await broken.recv(65536):
                pass  # the answer, then the close of this connection alone
        broken.close()
        sock = await _connect(port)
        assert await _request(sock, h11.Connection(h11.CLIENT)) == (200, b'{"ok": true}')
        sock.close()
    failures = [
        r
        for r in caplog.records
        if "hypercorn broke" in r.getMessage() or (r.exc_info and "hypercorn broke" in str(r.exc_info[1]))
    ]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert getattr(failures[0], "request_id", None) == "req-42"


# --- Deadlines ---------------------------------------------------------------------------------


def _limits(**values: Any) -> Any:
    from llmgw_control.transport.config import ListenersConfig

    return ListenersConfig(**values)


async def _read_all(sock: trio.socket.SocketType) -> bytes:
    received = b""
    while chunk := await sock.recv(65536):
        received += chunk
    return received


async def test_a_head_that_does_not_arrive_in_time_gets_408() -> None:
    async with serving(limits=_limits(head_timeout=0.3)) as (port, _):
        sock = await _connect(port)
        await sock.send(b"POST /v1/x HTTP/1.1\r\nhost: t\r\n")  # ... and the rest never comes
        with trio.fail_after(10):
            received = await _read_all(sock)
        assert received.startswith(b"HTTP/1.1 408 ") and b"connection: close" in received
        assert b'"request_timeout"' in received
        sock.close()


async def test_a_header_line_every_little_while_does_not_extend_the_head_deadline() -> None:
    async with serving(limits=_limits(head_timeout=0.5)) as (port, _):
        sock = await _connect(port)
        await sock.send(b"POST /v1/x HTTP/1.1\r\n")
        received = b""
        with trio.fail_after(10):
            for i in range(100):
                try:
                    await sock.send(b"x-slow-%d: 1\r\n" % i)
                except OSError:
                    break
                with trio.move_on_after(0.1):
                    if chunk := await sock.recv(65536):
                        received += chunk
                        break
            received += await _read_all(sock)
        assert received.startswith(b"HTTP/1.1 408 "), received[:200]
        sock.close()


async def test_a_body_that_stalls_gets_408_and_the_app_learns_the_client_is_gone() -> None:
    seen: list[str] = []

    async def reading(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _answer_json(scope, receive, send)
            return
        while (message := await receive())["type"] == "http.request" and message.get("more_body"):
            pass
        seen.append(message["type"])

    async with serving(reading, limits=_limits(body_timeout=0.3)) as (port, _):
        sock = await _connect(port)
        await sock.send(b'POST /v1/x HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n{"half":')
        with trio.fail_after(10):
            received = await _read_all(sock)
        assert received.startswith(b"HTTP/1.1 408 ") and b"connection: close" in received
        sock.close()
        await wait_until(lambda: seen, timeout=5, interval=0.01)
        assert seen == ["http.disconnect"]


@pytest.mark.slow  # left out of the quick tier: the trickle itself takes seconds
async def test_a_body_that_trickles_a_byte_at_a_time_gets_408() -> None:
    # Each byte comes well within body_timeout of the last, so only a minimum rate can end it.
    async with serving(limits=_limits(body_timeout=0.5, body_min_rate=1000)) as (port, _):
        sock = await _connect(port)
        await sock.send(b"POST /v1/x HTTP/1.1\r\nhost: t\r\ncontent-length: 100000\r\n\r\n")
        received = b""
        with trio.fail_after(15):
            for _ in range(200):
                try:
                    await sock.send(b"x")
                except OSError:
                    break
                with trio.move_on_after(0.05):
                    if chunk := await sock.recv(65536):
                        received += chunk
                        break
            received += await _read_all(sock)
        assert received.startswith(b"HTTP/1.1 408 "), received[:200]
        sock.close()


async def test_a_body_that_arrives_at_a_fair_rate_is_not_cut() -> None:
    async with serving(limits=_limits(body_timeout=0.3, body_min_rate=50_000)) as (port, _):
        sock = await _connect(port)
        body = b"x" * 60_000
        await sock.send(b"POST /v1/x HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n" % len(body))
        for start in range(0, len(body), 10_000):  # 10 kB every 0.1 s: 100 kB/s, twice the minimum
            await sock.send(body[start : start + 10_000])
            await trio.sleep(0.1)  # the pace of the body is the behaviour under test, not a wait
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="POST", target="/v1/x", headers=[("host", "t"), ("content-length", "60000")]))
        conn.send(h11.Data(data=body))
        conn.send(h11.EndOfMessage())
        with trio.fail_after(5):
            assert await _read_response(sock, conn) == (200, b'{"ok": true}')
        sock.close()


async def _stream_forever(scope: dict[str, Any], receive: Any, send: Any, *, gone: list[float]) -> None:
    if scope["type"] == "lifespan":
        await _answer_json(scope, receive, send)
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            # As every ASGI app should (the gateway does): the disconnect says the client is gone.
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.append(trio.current_time())
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        while True:
            await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})


def _small_receive_buffer() -> trio.socket.SocketType:
    sock = trio.socket.socket()
    sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_RCVBUF, 4096)
    return sock


async def test_a_client_that_stops_reading_loses_its_connection_after_the_write_timeout() -> None:
    gone: list[float] = []
    async with serving(partial(_stream_forever, gone=gone), limits=_limits(write_timeout=0.5)) as (port, _):
        sock = _small_receive_buffer()
        await sock.connect(("127.0.0.1", port))
        await sock.send(b"GET /v1/x HTTP/1.1\r\nhost: t\r\n\r\n")
        await wait_until(lambda: gone, timeout=10)  # and it never reads
        sock.close()


async def test_a_write_to_a_client_that_stopped_reading_does_not_outlive_the_shutdown_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gone: list[float] = []
    writing: list[bytes] = []  # server writes begun and not yet finished
    original = trio.SocketStream.send_all

    async def tracked(self: trio.SocketStream, data: Any) -> None:
        writing.append(bytes(data))
        await original(self, data)
        writing.pop()

    monkeypatch.setattr(trio.SocketStream, "send_all", tracked)
    shutdown = trio.Event()
    sock = _small_receive_buffer()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(
                partial(
                    serve_asgi,
                    partial(_stream_forever, gone=gone),
                    "127.0.0.1:0",
                    shutdown=shutdown,
                    grace=0.3,
                    name="test",
                    limits=_limits(write_timeout=3600),
                )
            )
            await sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
            await sock.send(b"GET /v1/x HTTP/1.1\r\nhost: t\r\n\r\n")
            # Stuck: a write has begun and, with every other task idle, waits for room that never comes.
            while True:
                await trio.testing.wait_all_tasks_blocked(0.05)
                if writing:
                    break
            shutdown.set()
    sock.close()


# --- A bounded number of connections ----------------------------------------------------------


async def test_connections_beyond_the_limit_are_answered_503_and_closed() -> None:
    async with serving(limits=_limits(max_connections=2)) as (port, _):
        held = [await _connect(port) for _ in range(2)]
        for sock in held:  # both are being served
            assert (await _request(sock, h11.Connection(h11.CLIENT)))[0] == 200
        extra = await _connect(port)
        await extra.send(REQUEST)
        with trio.fail_after(5):
            received = await _read_all(extra)
        assert received.startswith(b"HTTP/1.1 503 ") and b"connection: close" in received
        assert b"retry-after: 1" in received and b'"too_many_connections"' in received
        extra.close()
        held.pop().close()

        async def served() -> bool:  # the closed one is counted out as soon as the server sees it go
            sock = await _connect(port)
            try:
                await sock.send(_encode(h11.Connection(h11.CLIENT), "/v1/x"))
                return (await sock.recv(65536)).startswith(b"HTTP/1.1 200 ")
            finally:
                sock.close()

        await wait_until(served, timeout=5)
        for sock in held:
            sock.close()


# --- 100 Continue, and answers that come before the request is read ----------------------------


async def _refuse_on_head(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _answer_json(scope, receive, send)
        return
    if scope["path"] == "/refuse":
        body = b'{"error": "no key"}'
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
        return
    await _answer_json(scope, receive, send)


async def test_no_100_continue_for_a_request_refused_on_its_head() -> None:
    async with serving(_refuse_on_head) as (port, _):
        sock = await _connect(port)
        await sock.send(b"POST /refuse HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 30000000\r\n\r\n")
        with trio.fail_after(5):
            received = await _read_all(sock)  # the client never sends its body: it was not invited
        assert received.startswith(b"HTTP/1.1 401 "), received[:100]
        assert b"100 Continue" not in received and b"connection: close" in received
        sock.close()


async def test_100_continue_comes_when_the_app_asks_for_the_body() -> None:
    async with serving(_refuse_on_head) as (port, _):
        sock = await _connect(port)
        await sock.send(b"POST /v1/x HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n")
        with trio.fail_after(5):
            interim = await sock.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 "), interim
        await sock.send(b"{}")
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="POST", target="/v1/x", headers=[("host", "t"), ("content-length", "2")]))
        conn.send(h11.Data(data=b"{}"))
        conn.send(h11.EndOfMessage())
        with trio.fail_after(5):
            assert await _read_response(sock, conn) == (200, b'{"ok": true}')
        sock.close()


async def test_an_early_answer_to_a_large_body_says_close_and_reaches_a_client_still_sending() -> None:
    # The client writes its whole 8 MB body before it reads (as most clients do): the answer
    # waits for it, the body is read and dropped (no reset cuts the client's write), and
    # the answer says the connection is done.
    async with serving(_refuse_on_head) as (port, _):
        sock = await _connect(port)
        size = 8 * 1024 * 1024
        await sock.send(b"POST /refuse HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n" % size)
        chunk = b"x" * 65536
        with trio.fail_after(20):
            for _ in range(size // len(chunk)):
                await sock.send(chunk)
            received = await _read_all(sock)
        assert received.startswith(b"HTTP/1.1 401 ") and b"connection: close" in received
        assert received.endswith(b'{"error": "no key"}')
        sock.close()


async def test_two_answers_that_cross_close_the_connection_without_an_error(caplog: pytest.LogCaptureFixture) -> None:
    # Found by test_listener_fuzz: WebSocket frames sent with the handshake make hypercorn answer
    # 400 itself while the app refuses the handshake too; the two answers crossed in h11
    # (LocalProtocolError "Can't send data when our state is ERROR").
    async def refusing(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await _answer_json(scope, receive, send)

    async with serving(refusing) as (port, _):
        for _ in range(5):
            sock = await _connect(port)
            await sock.send(
                b"GET /ws HTTP/1.1\r\nhost: t\r\nconnection: Upgrade\r\nupgrade: websocket\r\n"
                b"sec-websocket-key: MDEyMzQ1Njc4OWFiY2RlZg==\r\nsec-websocket-version: 13\r\n\r\n"
                b"\x81\x85\x01\x02\x03\x04hello"
            )
            received = b""
            with trio.fail_after(5):  # the refusal, then the end of the connection
                while chunk := await sock.recv(65536):
                    received += chunk
            assert received.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 403 ")), received
            sock.close()
        sock = await _connect(port)
        assert await _request(sock, h11.Connection(h11.CLIENT)) == (200, b'{"ok": true}')
        sock.close()
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [r.getMessage() for r in caplog.records]
