"""One file from a URL into ``<name>.partial``: resumable, guarded, size-bounded, hashed as it lands.

Redirects are followed here, one hop at a time, each target passing ``NetGuard.check`` again
(the HTTP client never follows one by itself). The Hub token goes only to the Hub endpoint's
own origin (scheme, host and port: ``NetGuard.same_origin``, the rule the Hub client's transport
keeps too), never to a host it redirects to. A ``.partial`` file left by an earlier attempt is
continued with ``Range`` (its bytes hashed first, so the digest covers the whole file); a server
that ignores the Range and answers 200 restarts the file. More bytes than the expected size
stop the download: a hostile server cannot fill the disk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import attrs
import httpx2
import trio

from llmgw_shared.threads import DISK, FILES

from .net_guard import NetGuard, UrlRefused

# Redirects one download may take (the Hub takes one, to its LFS storage).
MAX_REDIRECTS = 5
# Bytes read and written at a time: large enough that the per-chunk work is noise.
CHUNK = 1024 * 1024
# Connecting and waiting for bytes: a stalled server is given up on (the pull retries, resuming).
CONNECT_TIMEOUT = 15.0
READ_TIMEOUT = 60.0


class DownloadFailed(Exception):
    """The download cannot finish as asked (not retried: a refusal, a wrong size, a 404)."""


class Interrupted(Exception):
    """The connection failed mid-way; trying again continues from the ``.partial`` file."""


# The rate is measured over this window (seconds), so an ETA follows the recent speed.
RATE_WINDOW = 5.0


@attrs.define
class DownloadProgress:
    """Bytes on disk, the expected total, and the recent rate (sampled as bytes arrive)."""

    done: int = 0
    total: int = 0
    samples: list[tuple[float, int]] = attrs.Factory(list)

    def at(self, done: int) -> None:
        self.done = done
        now = trio.current_time()
        if not self.samples or now - self.samples[-1][0] >= 0.25:
            self.samples.append((now, done))
            while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW:
                self.samples.pop(0)

    def rate(self) -> float:
        """Bytes per second over the last few seconds; 0 when stalled or not started."""
        if len(self.samples) < 2:
            return 0.0
        now = trio.current_time()
        (first_t, first_done) = self.samples[0]
        if now - self.samples[-1][0] > RATE_WINDOW:
            return 0.0  # nothing arrived for a while
        return (self.done - first_done) / max(now - first_t, 1e-3)


def _hash_file(path: Path) -> tuple[int, hashlib._Hash]:
    digest = hashlib.sha256()
    size = 0
    if not path.exists():
        return size, digest
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
            size += len(block)
    return size, digest


async def download(
    guard: NetGuard,
    url: str,
    partial: Path,
    *,
    size: int | None,
    token: str | None,
    progress: DownloadProgress,
    on_total: Callable[[int], None] | None = None,
) -> str:
    """Fetch ``url`` into ``partial`` until it is complete; its sha256. ``size`` bounds the file
    (None: the server's Content-Length, then checked with ``on_total`` before any byte lands)."""
    have, digest = await FILES.run(_hash_file, partial, abandon=True)
    if size is not None and have > size:
        await DISK.run(partial.unlink)
        have, digest = 0, hashlib.sha256()
    progress.at(have)
    if size is not None and have == size:
        return digest.hexdigest()
    timeout = httpx2.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)
    async with httpx2.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        for hop in range(MAX_REDIRECTS + 1):
            try:
                target = await guard.check(url, redirect=hop > 0)
            except UrlRefused as exc:
                raise DownloadFailed(f"refused {'redirect to ' if hop else ''}{_safe(url)}: {exc}") from None
            headers = {"accept-encoding": "identity"}
            if have:
                headers["range"] = f"bytes={have}-"
            if token and guard.same_origin(target.url):
                headers["authorization"] = f"Bearer {token}"
            try:
                async with client.stream("GET", url, headers=headers) as response:
                    if response.is_redirect:
                        location = response.headers.get("location", "")
                        if not location:
                            raise DownloadFailed("a redirect without a Location")
                        url = urljoin(url, location)
                        continue
                    if response.status_code == 416 and size is not None and have == size:
                        return digest.hexdigest()
                    if response.status_code == 200 and have:
                        have, digest = 0, hashlib.sha256()  # the server ignored Range: start over
                    elif response.status_code == 206:
                        if not response.headers.get("content-range", "").startswith(f"bytes {have}-"):
                            raise DownloadFailed("the server answered a different range than asked")
                    elif response.status_code != 200:
                        raise DownloadFailed(f"{_safe(url)} answered HTTP {response.status_code}")
                    if size is None:
                        length = response.headers.get("content-length", "")
                        if not length.isdigit():
                            raise DownloadFailed("the server gives no size (Content-Length): give the size")
                        size = have + int(length)
                    progress.total = size
                    if on_total is not None:
                        on_total(size - have)
                    return await _receive(response, partial, have, digest, size, progress)
            except (httpx2.TransportError, httpx2.StreamError) as exc:
                raise Interrupted(f"{type(exc).__name__} from {urlsplit(url).hostname}") from None
        raise DownloadFailed(f"more than {MAX_REDIRECTS} redirects")


async def _receive(
    response: httpx2.Response, partial: Path, have: int, digest: hashlib._Hash, size: int, progress: DownloadProgress
) -> str:
    mode = "ab" if have else "wb"
    async with await trio.open_file(partial, mode) as out:
        async for chunk in response.aiter_bytes():  # as it arrives: a cut connection keeps what came
            if have + len(chunk) > size:
                raise DownloadFailed(f"the server sent more than the {size} bytes expected")
            await out.write(chunk)
            digest.update(chunk)
            have += len(chunk)
            progress.at(have)
    if have != size:
        raise Interrupted(f"the connection ended at {have} of {size} bytes")
    return digest.hexdigest()


def _safe(url: str) -> str:
    """A URL for messages: without its query (signed CDN URLs carry credentials there)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"[:300]
