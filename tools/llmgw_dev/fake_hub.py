"""A small local fake of the Hugging Face Hub endpoints the model mirror uses, for tests and the demo.

No test reaches the internet, so the mirror's tests run against this: the model search
(``GET /api/models?search=&filter=gguf&limit=&sort=``), a repository's tree with LFS metadata
(``GET /api/models/{repo}/tree/{revision}?recursive=&expand=``) and file downloads
(``GET|HEAD /{repo}/resolve/{revision}/{path}``, with ``Range``). Every request is recorded, and
one that none of those routes serves is recorded in ``unserved`` and answered 404, so a test
can assert that the client library asks for exactly what this fake serves.

Faults a test can ask for: ``cut_after`` drops the connection after that many body bytes of
the next download (then resets), ``redirect_to`` answers a download with a 302 to that URL,
``ignore_range`` answers 200 with the whole file whatever the Range; ``api_redirect_to``
answers every ``/api/`` request with ``api_redirect_status`` to that URL, ``next_page`` adds a
``Link: <next_page>; rel="next"`` to a search or tree answer (once, or on every page with
``endless_pages``).

A deliberately small trio + h11 server, one request per connection (``Connection: close``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from urllib.parse import parse_qs, unquote, urlsplit

import attrs
import h11
import trio

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


@attrs.define
class FakeRepo:
    files: dict[str, bytes]
    downloads: int = 0
    likes: int = 0
    tags: list[str] = attrs.Factory(lambda: ["gguf"])


@attrs.define
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]


@attrs.define
class FakeHub:
    repos: dict[str, FakeRepo] = attrs.Factory(dict)
    url: str = ""
    seen: list[Seen] = attrs.Factory(list)
    unserved: list[Seen] = attrs.Factory(list)
    cut_after: int | None = None
    redirect_to: str | None = None
    ignore_range: bool = False
    # Set once a download body starts: tests wait on it instead of sleeping.
    sending: trio.Event = attrs.Factory(trio.Event)
    # Sizes the tree states for some files instead of their real one (a "70B model" in a test).
    claimed_sizes: dict[str, int] = attrs.Factory(dict)
    # Seconds between 64 KiB chunks of a download body, for tests that watch a pull in progress.
    chunk_delay: float = 0.0
    api_redirect_to: str | None = None
    api_redirect_status: int = 302
    next_page: str | None = None
    endless_pages: bool = False

    def answer(self, method: str, target: str, headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        parts = urlsplit(target)
        path = unquote(parts.path)
        seen = Seen(method, path, parse_qs(parts.query), headers)
        self.seen.append(seen)
        if self.api_redirect_to is not None and path.startswith("/api/"):
            return self.api_redirect_status, [("location", self.api_redirect_to)], b""
        if method == "GET" and path == "/api/models":
            return self._paged(seen.query, self._search(seen.query))
        match = _TREE.fullmatch(path)
        if method == "GET" and match:
            return self._paged(seen.query, self._tree(match[1], match[2]))
        match = _RESOLVE.fullmatch(path)
        if method in ("GET", "HEAD") and match:
            return self._resolve(match[1], match[3], headers, method)
        self.unserved.append(seen)
        return _json(404, {"error": "not served by the fake hub"})

    def _paged(
        self, query: dict[str, list[str]], answer: tuple[int, list[tuple[str, str]], bytes]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        status, headers, body = answer
        if self.next_page is not None and status == 200 and (self.endless_pages or "cursor" not in query):
            headers = [*headers, ("link", f'<{self.next_page}>; rel="next"')]
        return status, headers, body

    def _search(self, query: dict[str, list[str]]) -> tuple[int, list[tuple[str, str]], bytes]:
        text = (query.get("search") or [""])[0].lower()
        wanted = query.get("filter") or []
        limit = int((query.get("limit") or ["1000"])[0])
        found = [
            {
                "id": name,
                "_id": name,
                "downloads": repo.downloads,
                "likes": repo.likes,
                "tags": repo.tags,
                "lastModified": "2026-11-01T00:00:00.000Z",
                "private": False,
            }
            for name, repo in sorted(self.repos.items(), key=lambda kv: -kv[1].downloads)
            if text in name.lower() and all(tag in repo.tags for tag in wanted)
        ]
        return _json(200, found[:limit])

    def _tree(self, repo_id: str, revision: str) -> tuple[int, list[tuple[str, str]], bytes]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return _json(404, {"error": "Repository not found"}, [("x-error-code", "RepoNotFound")])
        entries = []
        for name, data in sorted(repo.files.items()):
            size = self.claimed_sizes.get(name, len(data))
            entry = {"type": "file", "path": name, "size": size, "oid": hashlib.sha1(data).hexdigest()}
            if name.endswith(".gguf"):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
            entries.append(entry)
        return _json(200, entries)

    def _resolve(
        self, repo_id: str, name: str, headers: dict[str, str], method: str
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        repo = self.repos.get(repo_id)
        if repo is None or name not in repo.files:
            return _json(404, {"error": "Entry not found"}, [("x-error-code", "EntryNotFound")])
        if self.redirect_to:
            return 302, [("location", self.redirect_to)], b""
        data = repo.files[name]
        common = [
            ("accept-ranges", "bytes"),
            ("x-linked-size", str(len(data))),
            ("x-linked-etag", f'"{hashlib.sha256(data).hexdigest()}"'),
        ]
        wanted = _RANGE.fullmatch(headers.get("range", ""))
        if wanted and not self.ignore_range:
            start = int(wanted[1])
            end = int(wanted[2]) if wanted[2] else len(data) - 1
            if start >= len(data):
                return 416, [("content-range", f"bytes */{len(data)}")], b""
            end = min(end, len(data) - 1)
            body = data[start : end + 1]
            return (
                206,
                [*common, ("content-range", f"bytes {start}-{end}/{len(data)}")],
                b"" if method == "HEAD" else body,
            )
        return 200, common, b"" if method == "HEAD" else data


def _json(
    status: int, value: object, extra: list[tuple[str, str]] | None = None
) -> tuple[int, list[tuple[str, str]], bytes]:
    return status, [("content-type", "application/json"), *(extra or [])], json.dumps(value).encode()


async def _serve(hub: FakeHub, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    async with stream:
        request = None
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                return
            if event is h11.NEED_DATA:
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                conn.receive_data(data)
                if not data:
                    return
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                return
        assert request is not None
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in request.headers}
        method = request.method.decode()
        status, extra, body = hub.answer(method, request.target.decode("latin-1"), headers)
        length = len(body)
        if method == "HEAD" and status in (200, 206):
            length = int(dict(extra).get("x-linked-size", "0"))
            if status == 206:
                start, _, end = dict(extra)["content-range"].split(" ")[1].split("/")[0].partition("-")
                length = int(end) - int(start) + 1
        response = h11.Response(
            status_code=status, headers=[*extra, ("content-length", str(length)), ("connection", "close")]
        )
        try:
            await stream.send_all(conn.send(response) or b"")
            if method == "HEAD":
                return
            cut = None
            if status in (200, 206) and "/resolve/" in request.target.decode("latin-1"):
                cut, hub.cut_after = hub.cut_after, None
                hub.sending.set()
            sent = 0
            while sent < len(body):
                chunk = body[sent : sent + 65536]
                if cut is not None and sent + len(chunk) > cut:
                    await stream.send_all(conn.send(h11.Data(data=chunk[: cut - sent])) or b"")
                    return  # drop the connection mid-body
                await stream.send_all(conn.send(h11.Data(data=chunk)) or b"")
                sent += len(chunk)
                if hub.chunk_delay:
                    await trio.sleep(hub.chunk_delay)
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


@asynccontextmanager
async def run_fake_hub(hub: FakeHub | None = None, *, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[FakeHub]:
    """Serve a fake Hub until the block exits."""
    hub = hub if hub is not None else FakeHub()
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    hub.url = f"http://{host}:{bound}"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trio.serve_listeners, partial(_serve, hub), listeners))
        try:
            yield hub
        finally:
            nursery.cancel_scope.cancel()
