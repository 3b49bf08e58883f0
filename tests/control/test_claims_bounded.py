"""A claim is estimated from a bounded read of the model file, even from a server ignoring Range."""

from __future__ import annotations

from functools import partial

import trio

from llmgw_control.catalog import ProfileConfig, WeightsConfig
from llmgw_control.catalog.claims import _HEADER_BYTES, _header_bytes

BODY = 256 * 1024 * 1024  # a "model" far larger than the header read


async def test_a_server_that_ignores_range_is_read_only_as_far_as_the_header() -> None:
    written = [0]
    done = trio.Event()

    async def whole_file_every_time(stream: trio.SocketStream) -> None:
        try:
            request = b""
            while b"\r\n\r\n" not in request:
                request += await stream.receive_some(4096)
            assert b"range: bytes=0-" in request.lower()
            # 200 and the whole file, as a server that does not do Range answers.
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n\r\n" % BODY
            )
            chunk = b"\0" * (1 << 20)
            while written[0] < BODY:
                await stream.send_all(chunk)
                written[0] += len(chunk)
        except trio.BrokenResourceError:
            pass  # the reader had enough and closed
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, whole_file_every_time, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        profile = ProfileConfig(name="cpu", weights=WeightsConfig(f"http://127.0.0.1:{port}/m.gguf", "a" * 64, BODY))
        data = await _header_bytes(profile, None)
        with trio.fail_after(10):
            await done.wait()
        nursery.cancel_scope.cancel()
    assert data is not None and len(data) == _HEADER_BYTES
    # What was sent before the reader closed: the header's share plus what socket buffers hold.
    assert written[0] < 4 * _HEADER_BYTES, written[0]
