"""An answer that comes before its request was read (401, 403, 413) goes first, then the
connection is drained for reuse or closed -- and says ``connection: close`` when it will not be
reused -- on every listener and on the dashboard's paths of the client port.
"""

from __future__ import annotations

import h11
import trio

from support.gateway import running_gateway


async def _connect(url: str) -> trio.socket.SocketType:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = trio.socket.socket()
    await sock.connect((host, int(port)))
    return sock


async def _answer(sock: trio.socket.SocketType, conn: h11.Connection) -> tuple[h11.Response, bytes]:
    response: h11.Response | None = None
    body = b""
    with trio.fail_after(10):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await sock.recv(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response, body
            elif isinstance(event, h11.ConnectionClosed):
                raise AssertionError("closed before the answer ended")


def _says_close(response: h11.Response) -> bool:
    return any(name == b"connection" and value.lower() == b"close" for name, value in response.headers)


async def _post(url: str, path: str, body: bytes, then: bytes = b"") -> tuple[h11.Response, bytes, bytes]:
    """POST ``body`` whole (as most clients do before they read), then ``then`` on the same connection.

    Returns the answer and what came back for ``then`` (b"" when the server closed instead).
    """
    sock = await _connect(url)
    conn = h11.Connection(h11.CLIENT)
    data = conn.send(
        h11.Request(
            method="POST",
            target=path,
            headers=[("host", "127.0.0.1"), ("content-type", "application/json"), ("content-length", str(len(body)))],
        )
    )
    await sock.send(data)
    for start in range(0, len(body), 65536):
        await sock.send(body[start : start + 65536])
    response, answer = await _answer(sock, conn)
    after = b""
    if then and not _says_close(response):
        await sock.send(then)
        with trio.fail_after(10):
            after = await sock.recv(65536)
    sock.close()
    return response, answer, after


HEALTH = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"


async def test_a_413_on_the_admin_listener_says_close_and_the_client_sees_it() -> None:
    async with running_gateway() as gw:
        response, answer, _ = await _post(gw.listening.admin_url, "/api/v1/groups", b"x" * (2 * 1024 * 1024))
        assert response.status_code == 413 and _says_close(response), response
        assert b"body_too_large" in answer


async def test_a_small_refused_body_keeps_the_connection_for_the_next_request() -> None:
    async with running_gateway() as gw:
        # Refused before the body is read: the rest is read and dropped, the connection reused.
        response, _, after = await _post(gw.listening.admin_url, "/api/v1/groups", b"x" * 20_000, then=HEALTH)
        assert response.status_code == 400 and not _says_close(response)
        assert after.startswith(b"HTTP/1.1 200 "), after


async def test_an_oversized_dashboard_login_is_answered_early_and_says_close() -> None:
    async with running_gateway() as gw:
        # Past the pages' 64 KiB limit the form is not read (Quart then sees no key: 401).
        response, _, _ = await _post(gw.url, "/admin/login", b"key=" + b"x" * 2_000_000)
        assert response.status_code in (401, 413) and _says_close(response), response


async def test_the_client_ports_admin_api_refuses_on_the_head() -> None:
    async with running_gateway() as gw:
        # No session: 401 before the body is read, and a large body is not read at all.
        response, answer, _ = await _post(gw.url, "/admin/api/v1/keys", b"{" + b" " * 5_000_000 + b"}")
        assert response.status_code == 401 and _says_close(response)
        assert b"login_required" in answer
        response, _, after = await _post(gw.url, "/admin/api/v1/keys", b"{}", then=HEALTH)
        assert response.status_code == 401 and after.startswith(b"HTTP/1.1 200 "), after


async def test_a_state_changing_dashboard_request_without_a_session_gets_no_100_continue() -> None:
    async with running_gateway() as gw:
        sock = await _connect(gw.url)
        await sock.send(
            b"POST /admin/logout HTTP/1.1\r\nhost: 127.0.0.1\r\nexpect: 100-continue\r\n"
            b"content-type: application/x-www-form-urlencoded\r\ncontent-length: 1000000\r\n\r\n"
        )
        received = b""
        with trio.fail_after(10):
            while chunk := await sock.recv(65536):
                received += chunk
        sock.close()
        assert received.startswith(b"HTTP/1.1 401 "), received[:200]
        assert b"100 Continue" not in received and b"login_required" in received
