"""A local stand-in for GitHub and a model host: release JSON plus files, with HTTP Range.

A bare ASGI app on hypercorn's trio worker, bound to 127.0.0.1 on a free port. Tests put files
in it (engine archives, model weights), publish a GitHub-shaped release JSON naming them, and
can cut a download short after N bytes to exercise resuming.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@attrs.define
class FileServer:
    base: str = ""
    files: dict[str, bytes] = attrs.field(factory=dict)
    releases: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    # path -> close the connection after this many body bytes (once), to simulate a cut download.
    cut_after: dict[str, int] = attrs.field(factory=dict)
    # (path, Range header or "") for every file request, so a test can see a resume happen.
    requests: list[tuple[str, str]] = attrs.field(factory=list)
    # The path of every release index request, so a test can count install attempts.
    index_requests: list[str] = attrs.field(factory=list)

    def add_file(self, name: str, data: bytes) -> str:
        self.files[f"/files/{name}"] = data
        return f"{self.base}/files/{name}"

    def release_api(self, repo: str = "ggml-org/llama.cpp") -> str:
        """The release-API URL template the node is given (``{version}`` is the tag)."""
        return f"{self.base}/repos/{repo}/releases/tags/{{version}}"

    def publish(
        self,
        tag: str,
        assets: dict[str, bytes],
        *,
        digests: dict[str, str] | None = None,
        repo: str = "ggml-org/llama.cpp",
        listed_as: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """A release whose assets are served here; ``digests`` overrides a published sha256
        (hex), ``listed_as`` any field of an asset's entry (a hostile name or digest, say)."""
        listed = []
        for name, data in assets.items():
            url = self.add_file(name, data)
            digest = (digests or {}).get(name, sha256_hex(data))
            entry = {
                "name": name,
                "size": len(data),
                "browser_download_url": url,
                "digest": f"sha256:{digest}",
                "content_type": "application/octet-stream",
            }
            entry.update((listed_as or {}).get(name, {}))
            listed.append(entry)
        self.releases[f"/repos/{repo}/releases/tags/{tag}"] = {"tag_name": tag, "assets": listed}

    def index_path(self, tag: str, repo: str = "ggml-org/llama.cpp") -> str:
        return f"/repos/{repo}/releases/tags/{tag}"

    def index_bytes(self, tag: str, repo: str = "ggml-org/llama.cpp") -> bytes:
        """The release JSON exactly as it is served (what a signature must cover)."""
        return json.dumps(self.releases[self.index_path(tag, repo)]).encode()

    def add_signature(self, tag: str, signature: bytes, repo: str = "ggml-org/llama.cpp") -> None:
        """Serve ``signature`` at the index URL plus ``.minisig``, where nodes look for it."""
        self.files[self.index_path(tag, repo) + ".minisig"] = signature

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if path in self.releases:
            self.index_requests.append(path)
            await _respond(send, 200, json.dumps(self.releases[path]).encode(), "application/json")
            return
        data = self.files.get(path)
        if data is None:
            await _respond(send, 404, b'{"message": "Not Found"}', "application/json")
            return
        rng = headers.get("range", "")
        self.requests.append((path, rng))
        start = 0
        status = 200
        if rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes=") : -1])
            if start >= len(data):
                await _respond(send, 416, b"", "text/plain")
                return
            status = 206
        body = data[start:]
        extra = [(b"content-range", f"bytes {start}-{len(data) - 1}/{len(data)}".encode())] if status == 206 else []
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/octet-stream"),
                    (b"content-length", str(len(body)).encode()),
                    (b"accept-ranges", b"bytes"),
                    *extra,
                ],
            }
        )
        cut = self.cut_after.pop(path, None)
        if cut is not None:
            await send({"type": "http.response.body", "body": body[:cut], "more_body": True})
            # Returning before the last body message makes hypercorn drop the connection.
            return
        chunk = 256 << 10
        for offset in range(0, len(body), chunk):
            await send({"type": "http.response.body", "body": body[offset : offset + chunk], "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def run_file_server() -> AsyncIterator[FileServer]:
    server = FileServer()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: serve(server, config, shutdown_trigger=shutdown.wait, task_status=task_status)
        )
        server.base = urls[0].rstrip("/")
        try:
            yield server
        finally:
            shutdown.set()
