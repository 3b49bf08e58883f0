"""Model files: fetched once into a shared cache, verified, counted, removed on command.

Files live at ``<data_dir>/weights/<sha256>`` so two replicas that name the same file share one
download (the second waits for the first) and one copy on disk. A local path is used in place
after its size and digest are checked: it is the operator's file, never deleted by the node.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import httpx2
import trio

from llmgw_node.disk import DISK_MARGIN, NotEnoughDisk, check_room
from llmgw_node.fetch import FetchError, fetch, human_size, sha256_file
from llmgw_shared.logs import get_logger
from llmgw_shared.names import BadName, check_sha256, check_weight_file_name
from llmgw_shared.threads import DISK
from llmgw_shared.wire import MAX_ITEMS, WeightsHeld, WeightsSpec

log = get_logger(__name__)


class WeightsError(Exception):
    """The weights could not be fetched or verified, or the disk is too full; the text says which."""


class WeightsCache:
    def __init__(
        self,
        data_dir: Path,
        client: httpx2.AsyncClient,
        *,
        margin: int = DISK_MARGIN,
        on_use_change: Callable[[], None] | None = None,
    ) -> None:
        self.root = data_dir / "weights"
        self.client = client
        self.margin = margin
        # Called when a file gains or loses its last user. A replica's "stopped" report goes out
        # before its hold on the file is given back, so a listing made on that report still says "in use";
        # without this second wake-up the node reported a stale in_use for a whole
        # FACTS_INTERVAL and control's weights GC would not collect the file (seen in CI).
        self._on_use_change = on_use_change
        self._locks: dict[str, trio.Lock] = {}
        # sha256 -> ids of the replicas using the file.
        self._users: dict[str, set[str]] = {}
        # Local files already verified in this run (path -> sha256): a restart loop must not
        # re-hash a 40 GB file on every crash.
        self._verified: dict[str, str] = {}

    def path_for(self, spec: WeightsSpec) -> Path:
        if _is_local(spec.url):
            return Path(spec.url.removeprefix("file://"))
        return self.root / spec.sha256.lower()

    def acquire(self, sha256: str, user: str) -> None:
        users = self._users.setdefault(sha256.lower(), set())
        first = not users
        users.add(user)
        self._touch(sha256)
        if first:
            self._use_changed()

    def give_back(self, sha256: str, user: str) -> None:
        """``user`` no longer holds the file (its hold from ``acquire`` given back; twice is harmless)."""
        users = self._users.get(sha256.lower())
        if users is not None:
            users.discard(user)
            if not users:
                del self._users[sha256.lower()]
                self._use_changed()
        self._touch(sha256)

    def _use_changed(self) -> None:
        if self._on_use_change is not None:
            self._on_use_change()

    def _touch(self, sha256: str) -> None:
        """Record a use in the file's mtime: when it was last used survives a daemon restart, and
        the content is its digest's to vouch for, not the time's."""
        # Not there: not downloaded yet (it is new then), or a local file, which is the operator's.
        # One utime call, cheap enough for the event loop.
        with contextlib.suppress(OSError):
            os.utime(self.root / sha256.lower())

    def held(self) -> list[WeightsHeld]:
        """The files in the cache, most recently used first (blocking: a directory listing)."""
        out: list[WeightsHeld] = []
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return out
        for entry in entries:
            try:
                sha = check_sha256(entry.name)
                info = entry.stat(follow_symlinks=False)
            except (BadName, OSError):
                continue  # a .part download, or something that is not a cache file
            # In use: used now, whatever the mtime says (control reads it so); the mtime is when a
            # replica last started or ended on it, so a report does not change while nothing does.
            out.append(WeightsHeld(sha, info.st_size, max(info.st_mtime, 0.0), self.in_use(sha)))
        out.sort(key=lambda w: (-w.last_used, w.sha256))
        return out[:MAX_ITEMS]

    def in_use(self, sha256: str) -> bool:
        return bool(self._users.get(sha256.lower()))

    async def ensure(self, spec: WeightsSpec, progress: Callable[[str], None] | None = None) -> Path:
        """Return a verified local path for ``spec``, downloading it when the cache lacks it."""
        try:
            sha = check_sha256(spec.sha256)
        except BadName:
            raise WeightsError(f"weights sha256 {spec.sha256!r} is not 64 hex digits") from None
        target = self.path_for(spec)
        lock = self._locks.setdefault(sha, trio.Lock())
        async with lock:
            if _is_local(spec.url):
                await self._verify_local(target, spec)
                return target
            name = _display_name(spec.url, sha)
            await DISK.run(self._check_space, target, spec.size, name, abandon=True)
            last = [-1]

            def on_progress(done: int, total: int | None) -> None:
                pct = int(done * 100 / total) if total else -1
                if progress is not None and pct != last[0]:
                    last[0] = pct
                    progress(f"downloading {name} ({human_size(spec.size)}, {pct}%)")

            try:
                return await fetch(
                    self.client, spec.url, target, sha256=sha, size=spec.size, progress=on_progress, label=name
                )
            except FetchError as exc:
                raise WeightsError(str(exc)) from None

    async def _verify_local(self, path: Path, spec: WeightsSpec) -> None:
        if self._verified.get(str(path)) == spec.sha256.lower():
            return
        try:
            size = (await trio.Path(path).stat()).st_size
        except OSError as exc:
            raise WeightsError(f"weights {path}: {exc.strerror}") from None
        if size != spec.size:
            raise WeightsError(f"weights {path}: {size} bytes, expected {spec.size}")
        actual = await sha256_file(path)
        if actual != spec.sha256.lower():
            raise WeightsError(f"weights {path}: sha256 {actual} differs from the expected {spec.sha256}")
        self._verified[str(path)] = actual

    def _check_space(self, target: Path, size: int, name: str) -> None:
        if target.exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        have = part.stat().st_size if part.exists() else 0
        try:
            check_room(self.root, size - have, name, margin=self.margin)
        except NotEnoughDisk as exc:
            raise WeightsError(str(exc)) from None

    def remove(self, sha256s: list[str]) -> tuple[list[str], list[str]]:
        """Delete cached files no running replica uses; return (removed, kept because in use).

        Each entry must be 64 hex digits (``WeightsError`` names the first that is not, and
        nothing is deleted): the digest is the file's name, and ``../`` would name any file.
        """
        try:
            wanted = [check_sha256(s) for s in sha256s]
        except BadName as exc:
            raise WeightsError(f"remove_weights: {exc}") from None
        removed, kept = [], []
        for sha in wanted:
            if self.in_use(sha):
                kept.append(sha)
                continue
            for path in (self.root / sha, self.root / f"{sha}.part"):
                try:
                    path.unlink()
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise WeightsError(f"remove_weights: {path}: {exc.strerror}") from None
                removed.append(sha)
        return sorted(set(removed)), kept


def _display_name(url: str, sha: str) -> str:
    """The file name a weights URL ends in, for progress and errors; its digest's start when that
    is not a plain file name (the URL is control's to choose; the text reaches logs)."""
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    try:
        return check_weight_file_name(name)
    except BadName:
        return sha[:12]


def _is_local(url: str) -> bool:
    return url.startswith("/") or url.startswith("file://")
