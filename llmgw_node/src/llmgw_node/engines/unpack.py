"""Unpack a tar.gz or zip archive into a directory it cannot leave, by construction.

``tarfile`` and ``zipfile`` only read entries here; writing is ours, the same code for both:

1. **Read every entry's header first** and refuse, naming the entry, anything that could escape
   or break the unpack: absolute paths, ``..`` components, NUL or control characters, names
   over NAME_MAX, paths over ``MAX_PATH_BYTES``, an entry inside something that is not a folder,
   a name that appears twice, device files and fifos, hardlinks to anything but a file earlier
   in the same archive, symlinks whose target leaves the tree, resolved lexically against the
   link's folder and then as the kernel would, through the archive's links and those already on
   disk. The caps on entries and bytes, and the free space, are checked against the declared
   sizes as the headers go by, so a gzip bomb is refused at its header, before a byte is written.
2. **Write with directory file descriptors**: each folder is opened with ``O_NOFOLLOW |
   O_DIRECTORY`` relative to its parent, files are created with ``O_CREAT | O_EXCL |
   O_NOFOLLOW``, so no link is ever followed while unpacking, whatever is on disk, and no path
   longer than one component reaches the kernel (so PATH_MAX cannot make a check lie, which is
   how ``os.path.realpath`` -- and with it ``tarfile``'s ``data`` filter on Python 3.11.7 -- was
   fooled into calling a link past PATH_MAX "inside"). Hardlinks and then symlinks come last.
3. **Walk the finished tree** the same way and resolve every link again: the second line, and
   the one that sees links of an earlier archive unpacked into the same folder.

Every failure is an ``UnsafeArchive`` whose text names the archive or the entry; the caller
unpacks into a fresh staging directory and deletes it on failure. ``safe_unpack`` blocks (run it
in a thread): it cannot be cancelled half-way, and its work is bounded by ``UnpackLimits``.

One module of about 630 lines on purpose: the checks on the headers and the writes that rely on
them are one argument about what an archive can reach, and a reader must see both to trust it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tarfile
import zipfile
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Literal

import attrs

from llmgw_node.disk import DISK_MARGIN, NotEnoughDisk, check_room, free_bytes
from llmgw_node.fetch import human_size
from llmgw_shared.names import shown

# NAME_MAX on every Linux filesystem an engine is installed on (ext4, xfs, btrfs, tmpfs).
MAX_NAME_BYTES = 255
# Real archives' paths are under 100 bytes (llama-b6000/libggml-cuda.so); 1024 keeps the install
# folder plus any entry far below PATH_MAX (4096) whatever data_dir is, so every later tool that
# takes a whole path (ldd, the dynamic loader, the engine) can name every file.
MAX_PATH_BYTES = 1024
# Releases are one or two folders deep; 32 bounds the per-entry walk from the top.
MAX_DEPTH = 32
# The kernel's own limit on links followed in one lookup (MAXSYMLINKS, 40 since Linux 4.2).
MAX_LINK_HOPS = 40
# Bytes copied per read when writing an entry: 1 MiB, as the hashing of the same archives.
_CHUNK = 1 << 20

Kind = Literal["dir", "file", "symlink", "hardlink"]


class UnsafeArchive(Exception):
    """The archive was refused: an entry could escape or break the unpack, or it does not fit.

    The text names the archive or the entry and says why.
    """


@attrs.frozen
class UnpackLimits:
    """What one archive may unpack to; the node config's ``unpack_*`` settings."""

    # llama.cpp's CUDA 12 builds, the largest archives it publishes, unpack to about 1.5-2 GB:
    # 8 GiB is four times that, room for the next CUDA's bigger kernels, and still a bound.
    max_bytes: int = 8 << 30
    # Those archives hold a few dozen entries; 4096 is a hundred times that, while bounding the
    # inodes and the per-entry checks a hostile archive can cost.
    max_entries: int = 4096
    # Left free after unpacking: the same margin model weights keep.
    keep_free: int = DISK_MARGIN


@attrs.frozen
class _Entry:
    name: str  # as the archive spells it: every message names this
    parts: tuple[str, ...]
    kind: Kind
    size: int = 0
    executable: bool = False
    target: str = ""  # symlink: as written; hardlink: the file's path in the archive
    source: object = None  # the reader's handle for the data (TarInfo or ZipInfo)


# What a path names, for resolving links: ("dir"|"file"|"missing", "") or ("link", target).
Lookup = Callable[[tuple[str, ...]], tuple[str, str]]


def safe_unpack(archive: Path, dest: Path, limits: UnpackLimits | None = None, *, shown_as: str = "") -> None:
    """Unpack ``archive`` (by its name: .tar.gz/.tgz/.tar, or .zip/.whl) into the existing directory ``dest``.

    Messages name the archive ``shown_as`` (default: its file name).
    """
    limits = limits or UnpackLimits()
    shown_as = shown_as or archive.name
    # A wheel (NVIDIA's CUDA runtime libraries) is a zip archive.
    is_zip = archive.name.endswith((".zip", ".whl"))
    reader = _ZipReader(archive, shown_as) if is_zip else _TarReader(archive, shown_as)
    root_fd = _open_root(dest)
    try:
        with reader:
            entries = _scan(reader, dest, root_fd, limits)
            _write(reader, entries, dest, root_fd, limits)
        _verify_tree(root_fd)
    finally:
        os.close(root_fd)


# --------------------------------------------------------------------------- readers


class _Reader:
    """One archive format, read-only: its entries' headers, then each file's data."""

    kind = ""

    def __init__(self, archive: Path, shown_as: str) -> None:
        self.archive = archive
        self.shown_as = shown_as

    def __enter__(self) -> _Reader:
        with self.reading():
            self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.close()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Any error from the format's parser, whatever its type, means the archive is unreadable.

        ``tarfile``/``zipfile``/``gzip``/``zlib`` raise EOFError, zlib.error, OSError, ValueError,
        struct.error, RuntimeError, NotImplementedError, ... on hostile bytes: none may escape
        as a crash. Only parser calls run in here, never our own writes.
        """
        try:
            yield
        except UnsafeArchive:
            raise
        except Exception as exc:
            raise UnsafeArchive(
                f"{self.shown_as}: not a readable {self.kind} archive: {type(exc).__name__}: {exc}"
            ) from None

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def headers(self, max_entries: int) -> Iterator[_Entry | None]:
        """Each entry (None for the archive's own top folder), refusing past ``max_entries``."""
        raise NotImplementedError

    def data(self, entry: _Entry) -> IO[bytes]:
        raise NotImplementedError

    def too_many(self, max_entries: int) -> UnsafeArchive:
        return UnsafeArchive(f"{self.shown_as}: more than {max_entries} entries (unpack_max_entries)")


class _TarReader(_Reader):
    kind = "tar"
    _tar: tarfile.TarFile

    def open(self) -> None:
        self._tar = tarfile.open(self.archive, "r:*")  # noqa: SIM115 -- closed by close(), after both passes

    def close(self) -> None:
        self._tar.close()

    def headers(self, max_entries: int) -> Iterator[_Entry | None]:
        count = 0
        while True:
            with self.reading():
                # next() skips the previous entry's data: the caller checks each header's size
                # before asking for the next one, so a bomb is refused before it is inflated.
                info = self._tar.next()
            if info is None:
                return
            count += 1
            if count > max_entries:
                raise self.too_many(max_entries)
            yield _tar_entry(info)

    def data(self, entry: _Entry) -> IO[bytes]:
        assert isinstance(entry.source, tarfile.TarInfo)
        with self.reading():
            stream = self._tar.extractfile(entry.source)
        if stream is None:
            raise UnsafeArchive(f"entry {_q(entry.name)}: has no data")
        return stream


class _ZipReader(_Reader):
    kind = "zip"
    _zip: zipfile.ZipFile

    def open(self) -> None:
        self._zip = zipfile.ZipFile(self.archive)

    def close(self) -> None:
        self._zip.close()

    def headers(self, max_entries: int) -> Iterator[_Entry | None]:
        with self.reading():
            infos = self._zip.infolist()
        if len(infos) > max_entries:
            raise self.too_many(max_entries)
        for info in infos:
            yield self._entry(info)

    def _entry(self, info: zipfile.ZipInfo) -> _Entry | None:
        name = info.filename
        parts = _check_path(name)
        # The Unix mode in the high half; 0 from hosts that write none (a plain file or folder).
        mode = info.external_attr >> 16
        kind_bits = stat.S_IFMT(mode)
        if kind_bits in (stat.S_IFCHR, stat.S_IFBLK):
            raise UnsafeArchive(f"entry {_q(name)}: device file")
        if kind_bits == stat.S_IFIFO:
            raise UnsafeArchive(f"entry {_q(name)}: fifo")
        if kind_bits == stat.S_IFLNK:
            with self.reading(), self._zip.open(info) as stream:
                raw = stream.read(MAX_PATH_BYTES + 1)
            target = os.fsdecode(raw)
            return _entry(name, parts, "symlink", target=target)
        if info.is_dir() or kind_bits == stat.S_IFDIR:
            return _entry(name, parts, "dir")
        if kind_bits not in (0, stat.S_IFREG):
            raise UnsafeArchive(f"entry {_q(name)}: unsupported entry type {oct(kind_bits)}")
        return _entry(name, parts, "file", size=info.file_size, executable=bool(mode & 0o111), source=info)

    def data(self, entry: _Entry) -> IO[bytes]:
        assert isinstance(entry.source, zipfile.ZipInfo)
        with self.reading():
            return self._zip.open(entry.source)


def _tar_entry(info: tarfile.TarInfo) -> _Entry | None:
    name = info.name
    parts = _check_path(name)
    if info.ischr() or info.isblk():
        raise UnsafeArchive(f"entry {_q(name)}: device file")
    if info.isfifo():
        raise UnsafeArchive(f"entry {_q(name)}: fifo")
    if info.issym():
        return _entry(name, parts, "symlink", target=info.linkname)
    if info.islnk():
        return _entry(name, parts, "hardlink", target=info.linkname)
    if info.isdir():
        return _entry(name, parts, "dir")
    if info.isreg():
        return _entry(name, parts, "file", size=info.size, executable=bool(info.mode & 0o111), source=info)
    raise UnsafeArchive(f"entry {_q(name)}: unsupported entry type {info.type!r}")


def _entry(
    name: str,
    parts: tuple[str, ...],
    kind: Kind,
    *,
    size: int = 0,
    executable: bool = False,
    target: str = "",
    source: object = None,
) -> _Entry | None:
    if not parts:
        if kind != "dir":
            raise UnsafeArchive(f"entry {_q(name)}: names the top folder itself")
        return None  # "./": the folder we unpack into
    if size < 0:
        raise UnsafeArchive(f"entry {_q(name)}: negative size")
    return _Entry(name=name, parts=parts, kind=kind, size=size, executable=executable, target=target, source=source)


# --------------------------------------------------------------------------- names and links


def _q(name: str) -> str:
    """An entry's name for a message: quoted, and cut so that a 4 KB name cannot flood a line."""
    return shown(name, limit=200)


def _check_path(name: str) -> tuple[str, ...]:
    """The entry's path as components, or ``UnsafeArchive`` naming the entry and what is wrong."""
    if "\x00" in name:
        raise UnsafeArchive(f"entry {_q(name)}: NUL in the name")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise UnsafeArchive(f"entry {_q(name)}: control character in the name")
    if name.startswith("/") or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"entry {_q(name)}: absolute path")
    # A backslash is a separator to whoever made a zip on Windows: treat it as one everywhere.
    raw = name.replace("\\", "/").split("/")
    if ".." in raw:
        raise UnsafeArchive(f"entry {_q(name)}: '..' component")
    parts = tuple(p for p in raw if p not in ("", "."))
    if any(len(os.fsencode(p)) > MAX_NAME_BYTES for p in parts):
        raise UnsafeArchive(f"entry {_q(name)}: a name longer than {MAX_NAME_BYTES} bytes")
    if len(os.fsencode("/".join(parts))) > MAX_PATH_BYTES:
        raise UnsafeArchive(f"entry {_q(name)}: path longer than {MAX_PATH_BYTES} bytes")
    if len(parts) > MAX_DEPTH:
        raise UnsafeArchive(f"entry {_q(name)}: more than {MAX_DEPTH} folders deep")
    return parts


def _check_link_target(name: str, target: str, kind: str, base: tuple[str, ...]) -> tuple[str, ...]:
    """Lexical checks of a link's target; ``base`` is the folder it is read from. Its components."""
    if not target:
        raise UnsafeArchive(f"entry {_q(name)}: {kind} with an empty target")
    if "\x00" in target:
        raise UnsafeArchive(f"entry {_q(name)}: NUL in the {kind} target")
    if len(os.fsencode(target)) > MAX_PATH_BYTES:
        raise UnsafeArchive(f"entry {_q(name)}: {kind} target longer than {MAX_PATH_BYTES} bytes")
    if target.startswith("/"):
        raise UnsafeArchive(f"entry {_q(name)}: {kind} to absolute path {_q(target)}")
    where: list[str] = list(base)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not where:
                raise UnsafeArchive(f"entry {_q(name)}: {kind} to {_q(target)} points outside the install directory")
            where.pop()
        else:
            where.append(part)
    return tuple(where)


class _LinkLoop(Exception):
    pass


def _escapes(start: tuple[str, ...], target: str, lookup: Lookup) -> bool:
    """Whether following ``target`` from the folder ``start`` leaves the tree, as the kernel walks it.

    Component by component from ``start``: ``..`` goes up (above the top is out), a folder goes
    down, a link is replaced by its own target (read, never followed by the kernel), a file or a
    missing name ends the walk where the kernel would stop. No whole path is ever built, so no
    length limit can cut the walk short. ``_LinkLoop`` past ``MAX_LINK_HOPS`` links.
    """
    if target.startswith("/"):
        return True
    where = list(start)
    pending = deque(target.split("/"))
    hops = 0
    while pending:
        part = pending.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if not where:
                return True
            where.pop()
            continue
        kind, link = lookup((*where, part))
        if kind == "link":
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise _LinkLoop
            if link.startswith("/"):
                return True
            pending.extendleft(reversed(link.split("/")))
        elif kind == "dir":
            where.append(part)
        else:
            return False  # a file or nothing: the kernel stops here, inside
    return False


# --------------------------------------------------------------------------- pass 1: headers


def _scan(reader: _Reader, dest: Path, root_fd: int, limits: UnpackLimits) -> list[_Entry]:
    """Every entry, checked; refuses before anything is written."""
    entries: list[_Entry] = []
    tree: dict[tuple[str, ...], _Entry | None] = {}  # path -> entry (None: a folder only implied)
    total = 0
    room = free_bytes(dest) - limits.keep_free
    for entry in reader.headers(limits.max_entries):
        if entry is None:
            continue
        name = entry.name
        for depth in range(1, len(entry.parts)):
            above = tree.get(entry.parts[:depth])
            if above is not None and above.kind != "dir":
                shown = "/".join(entry.parts[:depth])
                raise UnsafeArchive(
                    f"entry {_q(name)}: inside {_q(shown)}, which is a "
                    f"{'symlink' if above.kind == 'symlink' else 'file'}"
                )
            tree.setdefault(entry.parts[:depth], None)
        if entry.parts in tree:
            before = tree[entry.parts]
            if entry.kind != "dir" or (before is not None and before.kind != "dir"):
                raise UnsafeArchive(f"entry {_q(name)}: appears twice in the archive")
        if entry.kind == "symlink":
            _check_link_target(name, entry.target, "symlink", entry.parts[:-1])
        elif entry.kind == "hardlink":
            if ".." in entry.target.replace("\\", "/").split("/"):
                raise UnsafeArchive(
                    f"entry {_q(name)}: hardlink to {_q(entry.target)} points outside the install directory"
                )
            parts = _check_link_target(name, entry.target, "hardlink", ())
            original = tree.get(parts)
            if original is None or original.kind not in ("file", "hardlink"):
                raise UnsafeArchive(
                    f"entry {_q(name)}: hardlink to {_q(entry.target)}, which is not a file earlier in the archive"
                )
            # A hardlink to a hardlink is one to the same file.
            entry = attrs.evolve(
                entry, target=original.target if original.kind == "hardlink" else "/".join(original.parts)
            )
        elif entry.kind == "file":
            total += entry.size
            if total > limits.max_bytes:
                raise UnsafeArchive(
                    f"{reader.shown_as}: unpacks to more than {human_size(limits.max_bytes)} "
                    f"(unpack_max_bytes), at entry {_q(name)}"
                )
            if total > room:
                try:
                    check_room(dest, total, f"unpacking {reader.shown_as}", margin=limits.keep_free)
                except NotEnoughDisk as exc:
                    raise UnsafeArchive(str(exc)) from None
        tree[entry.parts] = entry
        entries.append(entry)
    lookup = _combined_lookup(tree, root_fd)
    for entry in entries:
        if entry.kind == "symlink":
            _check_resolved(entry.name, entry.parts, entry.target, lookup)
    return entries


def _check_resolved(name: str, parts: tuple[str, ...], target: str, lookup: Lookup) -> None:
    try:
        out = _escapes(parts[:-1], target, lookup)
    except _LinkLoop:
        raise UnsafeArchive(f"entry {_q(name)}: a loop of links (more than {MAX_LINK_HOPS} in a row)") from None
    if out:
        raise UnsafeArchive(f"entry {_q(name)}: resolves outside the install directory through a link")


def _combined_lookup(tree: dict[tuple[str, ...], _Entry | None], root_fd: int) -> Lookup:
    """The tree as it will be: this archive's entries over what earlier archives left on disk."""
    on_disk = _disk_lookup(root_fd)

    def lookup(parts: tuple[str, ...]) -> tuple[str, str]:
        if parts in tree:
            entry = tree[parts]
            if entry is None or entry.kind == "dir":
                return "dir", ""
            return ("link", entry.target) if entry.kind == "symlink" else ("file", "")
        return on_disk(parts)

    return lookup


# --------------------------------------------------------------------------- pass 2: writing


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_root(dest: Path) -> int:
    try:
        return os.open(dest, _DIR_FLAGS)
    except OSError as exc:
        raise UnsafeArchive(f"cannot unpack into {dest}: {exc.strerror}") from None


def _open_dirs(root_fd: int, parts: tuple[str, ...], *, create: bool) -> int:
    """A descriptor of the folder ``parts`` under ``root_fd``, never following a link on the way.

    Raises OSError: ELOOP or ENOTDIR when a link or a file is in the way, ENOENT when a folder
    is missing and ``create`` is false.
    """
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _disk_lookup(root_fd: int) -> Lookup:
    def lookup(parts: tuple[str, ...]) -> tuple[str, str]:
        try:
            fd = _open_dirs(root_fd, parts[:-1], create=False)
        except OSError:
            return "missing", ""
        try:
            st = os.lstat(parts[-1], dir_fd=fd)
            if stat.S_ISLNK(st.st_mode):
                return "link", os.readlink(parts[-1], dir_fd=fd)
            return ("dir" if stat.S_ISDIR(st.st_mode) else "file"), ""
        except OSError:
            return "missing", ""
        finally:
            os.close(fd)

    return lookup


def _write(reader: _Reader, entries: list[_Entry], dest: Path, root_fd: int, limits: UnpackLimits) -> None:
    """Folders and files in archive order, then hardlinks, then symlinks: links last, so nothing
    is ever written through one (and nothing is followed anyway)."""
    budget = [limits.max_bytes]
    order = (
        [e for e in entries if e.kind in ("dir", "file")]
        + [e for e in entries if e.kind == "hardlink"]
        + [e for e in entries if e.kind == "symlink"]
    )
    for entry in order:
        try:
            parent = _open_dirs(root_fd, entry.parts[:-1], create=True)
            try:
                _write_one(reader, entry, parent, root_fd, budget)
            finally:
                os.close(parent)
        except OSError as exc:
            raise _write_error(reader.shown_as, entry, exc, dest) from None


def _write_one(reader: _Reader, entry: _Entry, parent: int, root_fd: int, budget: list[int]) -> None:
    last = entry.parts[-1]
    if entry.kind == "dir":
        try:
            os.mkdir(last, 0o755, dir_fd=parent)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(last, dir_fd=parent).st_mode):
                raise
    elif entry.kind == "file":
        fd = os.open(last, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
        try:
            _copy(reader, entry, fd, budget)
            # Keep the executable bit; drop setuid, setgid, sticky and write for others.
            os.fchmod(fd, 0o755 if entry.executable else 0o644)
        finally:
            os.close(fd)
    elif entry.kind == "hardlink":
        parts = tuple(entry.target.split("/"))
        source = _open_dirs(root_fd, parts[:-1], create=False)
        try:
            os.link(parts[-1], last, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(source)
    else:
        os.symlink(entry.target, last, dir_fd=parent)


def _copy(reader: _Reader, entry: _Entry, fd: int, budget: list[int]) -> None:
    stream = reader.data(entry)
    written = 0
    try:
        while True:
            with reader.reading():
                block = stream.read(_CHUNK)
            if not block:
                break
            written += len(block)
            budget[0] -= len(block)
            # The headers were checked; the data is held to them (a lying zip cannot grow past).
            if written > entry.size:
                raise UnsafeArchive(f"entry {_q(entry.name)}: holds more than its declared {entry.size} bytes")
            if budget[0] < 0:
                raise UnsafeArchive(f"{reader.shown_as}: unpacks to more than the cap (unpack_max_bytes)")
            view = memoryview(block)
            while view:
                view = view[os.write(fd, view) :]
    finally:
        with contextlib.suppress(Exception):
            stream.close()
    if written != entry.size:
        raise UnsafeArchive(f"entry {_q(entry.name)}: holds {written} bytes, its header says {entry.size}")


def _write_error(shown_as: str, entry: _Entry, exc: OSError, dest: Path) -> UnsafeArchive:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = human_size(free_bytes(dest))
        except OSError:
            free = "?"
        return UnsafeArchive(
            f"{shown_as}: the disk ran out at entry {_q(entry.name)} ({exc.strerror}); {free} free in {dest}"
        )
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
        return UnsafeArchive(f"entry {_q(entry.name)}: a link or a file is already in its place ({exc.strerror})")
    return UnsafeArchive(f"entry {_q(entry.name)}: cannot be unpacked: {exc.strerror or exc}")


# --------------------------------------------------------------------------- pass 3: the finished tree


def _verify_tree(root_fd: int) -> None:
    """Every link in the tree, resolved again against the tree as it now is; no special files."""
    lookup = _disk_lookup(root_fd)
    for parent, names in _walk(root_fd):
        fd = _open_dirs(root_fd, parent, create=False)
        try:
            for name in names:
                st = os.lstat(name, dir_fd=fd)
                shown = "/".join((*parent, name))
                if stat.S_ISLNK(st.st_mode):
                    try:
                        out = _escapes(parent, os.readlink(name, dir_fd=fd), lookup)
                    except _LinkLoop:
                        out = True
                    if out:
                        raise UnsafeArchive(f"entry {_q(shown)}: link resolves outside the install directory")
                elif not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                    raise UnsafeArchive(f"entry {_q(shown)}: a special file")
                elif st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    raise UnsafeArchive(f"entry {_q(shown)}: setuid or setgid")
        finally:
            os.close(fd)


def _walk(root_fd: int) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """(folder, its entry names) for every real folder of the tree; links are not descended."""
    todo: list[tuple[str, ...]] = [()]
    while todo:
        parent = todo.pop()
        fd = _open_dirs(root_fd, parent, create=False)
        try:
            with os.scandir(fd) as it:
                listed = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        finally:
            os.close(fd)
        yield parent, [name for name, _ in listed]
        todo.extend((*parent, name) for name, is_dir in listed if is_dir)
