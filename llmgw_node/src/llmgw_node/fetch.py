"""Download a file by URL into place: resumable, sha256-checked, progress reported.

Shared by engine archives and model weights. The bytes go to ``<dest>.part`` first and are
renamed only after the digest matches, so a file at ``dest`` is always a verified one. A
``.part`` left by an interrupted download is continued with an HTTP Range request.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import httpx2

from llmgw_shared.hashing import update_from_file
from llmgw_shared.logs import get_logger
from llmgw_shared.threads import DISK, FILES

log = get_logger(__name__)

# (bytes so far, total or None when the server does not say)
Progress = Callable[[int, int | None], None]
# Bytes per read of a download: 1 MiB, so a progress report and a cancellation come every MiB.
CHUNK = 1 << 20
# What httpx raises for a URL it cannot even send: InvalidURL is not an HTTPError, and the URL
# comes from the network (a release index, control), so it must end as a FetchError too.
URL_ERRORS = (httpx2.HTTPError, httpx2.InvalidURL)


class FetchError(Exception):
    """The file could not be fetched or failed its check; the text says which and why."""


def human_size(n: int | None) -> str:
    if n is None:
        return "? MB"
    if n < 1 << 20:
        return f"{max(1, round(n / 1024))} KB"
    if n < 1 << 30:
        return f"{round(n / (1 << 20))} MB"
    return f"{n / (1 << 30):.1f} GB"


async def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    await FILES.run(update_from_file, digest, path, abandon=True)
    return digest.hexdigest()


def _write(handle: object, data: bytes) -> None:
    handle.write(data)  # type: ignore[attr-defined]


async def fetch(
    client: httpx2.AsyncClient,
    url: str,
    dest: Path,
    *,
    sha256: str,
    size: int | None = None,
    progress: Progress | None = None,
    idle_timeout: float = 60.0,
    label: str = "",
) -> Path:
    """Make ``dest`` hold the verified file at ``url``; return ``dest``."""
    sha256 = sha256.lower()
    part = dest.with_name(dest.name + ".part")
    done, have = await DISK.run(_prepare, dest, part, size)
    if done:
        return dest
    digest = hashlib.sha256()
    if have:
        await FILES.run(update_from_file, digest, part, abandon=True)
    headers = {"Range": f"bytes={have}-"} if have else {}
    if have and size is not None and have == size:
        pass  # everything arrived last time; only the check and the rename are left
    else:
        try:
            async with client.stream("GET", url, headers=headers, timeout=idle_timeout, follow_redirects=True) as resp:
                if resp.status_code == 416 and have:
                    # The server says our range is past the end: the .part is complete or bogus;
                    # the digest below decides which.
                    pass
                elif resp.status_code not in (200, 206):
                    raise FetchError(f"{_short(url)}: HTTP {resp.status_code}")
                else:
                    if resp.status_code == 200 and have:
                        # No Range support: the body is the whole file again.
                        log.info(
                            "server ignored the range request; downloading from the start", extra={"url": _short(url)}
                        )
                        have = 0
                        digest = hashlib.sha256()
                    total = size
                    if total is None:
                        length = resp.headers.get("content-length")
                        total = have + int(length) if length and length.isdigit() else None
                    mode = "ab" if have else "wb"
                    handle = await DISK.run(open, part, mode)
                    try:
                        got = have
                        async for chunk in resp.aiter_bytes(CHUNK):
                            await DISK.run(_write, handle, chunk)
                            digest.update(chunk)
                            got += len(chunk)
                            if size is not None and got > size:
                                raise FetchError(f"{_short(url)}: server sent more than the expected {size} bytes")
                            if progress is not None:
                                progress(got, total)
                    finally:
                        await DISK.run(handle.close)
        except URL_ERRORS as exc:
            raise FetchError(f"{_short(url)}: {type(exc).__name__}: {exc}") from None
    await DISK.run(_finish, label or dest.name, url, dest, part, size, sha256, digest.hexdigest())
    return dest


def _prepare(dest: Path, part: Path, size: int | None) -> tuple[bool, int]:
    """(already there, bytes of a partial download to resume from)."""
    if dest.exists():
        return True, 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if size is not None and have > size:
        # Longer than the file should be: not a prefix of it. Start again.
        part.unlink()
        have = 0
    return False, have


def _finish(label: str, url: str, dest: Path, part: Path, size: int | None, expected: str, actual: str) -> None:
    got = part.stat().st_size if part.exists() else 0
    if size is not None and got != size:
        raise FetchError(f"{_short(url)}: got {got} bytes, expected {size} (will resume)")
    if actual != expected:
        part.unlink(missing_ok=True)
        raise FetchError(f"{label}: sha256 {actual} differs from the published {expected}")
    os.replace(part, dest)


def _short(url: str) -> str:
    # Never log query strings: presigned URLs carry credentials there.
    return url.split("?", 1)[0]
