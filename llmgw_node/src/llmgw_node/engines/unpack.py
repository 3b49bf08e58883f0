"""Unpack a tar.gz or zip archive into a directory, refusing anything that could escape it.

Every entry is checked before a single byte is written, and the refusal names the entry:
absolute paths, ``..`` components, symbolic or hard links that point outside the directory,
device files and fifos. tar extraction then also goes through ``tarfile``'s ``data`` filter,
and the finished tree is walked once more so a link that resolves outside is caught even if
it slipped past the textual checks. The caller unpacks into a fresh staging directory and
deletes it on failure, so nothing half-unpacked is ever left behind.
"""

from __future__ import annotations

import os
import posixpath
import stat
import tarfile
import zipfile
from pathlib import Path


class UnsafeArchive(Exception):
    """The archive has an entry that would write outside the install directory, or a special file."""


def _check_path(name: str) -> str:
    if name.startswith("/") or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"entry {name!r}: absolute path")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise UnsafeArchive(f"entry {name!r}: '..' component")
    return posixpath.normpath(name.replace("\\", "/"))


def _check_link_target(name: str, target: str, kind: str) -> None:
    """``target`` of a symlink is relative to the entry's folder, of a hardlink to the archive root."""
    if not target:
        raise UnsafeArchive(f"entry {name!r}: {kind} with an empty target")
    if target.startswith("/"):
        raise UnsafeArchive(f"entry {name!r}: {kind} to absolute path {target!r}")
    base = posixpath.dirname(name) if kind == "symlink" else ""
    resolved = posixpath.normpath(posixpath.join(base, target))
    if resolved == ".." or resolved.startswith("../"):
        raise UnsafeArchive(f"entry {name!r}: {kind} to {target!r} points outside the install directory")


def _check_tar_member(m: tarfile.TarInfo) -> None:
    name = _check_path(m.name)
    if m.ischr() or m.isblk():
        raise UnsafeArchive(f"entry {m.name!r}: device file")
    if m.isfifo():
        raise UnsafeArchive(f"entry {m.name!r}: fifo")
    if m.issym():
        _check_link_target(name, m.linkname, "symlink")
    elif m.islnk():
        if ".." in m.linkname.replace("\\", "/").split("/"):
            raise UnsafeArchive(f"entry {m.name!r}: hardlink to {m.linkname!r} points outside the install "
                                "directory")
        _check_link_target(name, m.linkname, "hardlink")
    elif not (m.isreg() or m.isdir()):
        raise UnsafeArchive(f"entry {m.name!r}: unsupported entry type {m.type!r}")


def _unpack_tar(archive: Path, dest: Path) -> None:
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for m in members:
                _check_tar_member(m)
            try:
                tar.extractall(dest, members=members, filter="data")
            except tarfile.FilterError as exc:
                member = getattr(exc, "tarinfo", None)
                entry = member.name if member is not None else "?"
                raise UnsafeArchive(f"entry {entry!r}: {exc}") from None
    except tarfile.TarError as exc:
        raise UnsafeArchive(f"{archive.name}: not a readable tar archive: {exc}") from None


def _unpack_zip(archive: Path, dest: Path) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            for info in infos:
                name = _check_path(info.filename)
                mode = info.external_attr >> 16
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                    raise UnsafeArchive(f"entry {info.filename!r}: device file")
                if stat.S_ISFIFO(mode):
                    raise UnsafeArchive(f"entry {info.filename!r}: fifo")
                if stat.S_ISLNK(mode):
                    _check_link_target(name, zf.read(info).decode(errors="replace"), "symlink")
            root = os.path.realpath(dest)
            for info in infos:
                name = _check_path(info.filename)
                mode = info.external_attr >> 16
                target = dest / name
                # Links unpacked earlier are on disk now: resolve through them, as tar's filter does,
                # so a chain of individually harmless links cannot carry a write outside.
                _inside(root, os.path.realpath(target.parent), info.filename)
                if stat.S_ISLNK(mode):
                    _inside(root, os.path.realpath(target.parent / zf.read(info).decode()), info.filename)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if stat.S_ISLNK(mode):
                    os.symlink(zf.read(info).decode(), target)
                    continue
                with zf.open(info) as src, open(target, "xb") as out:
                    while block := src.read(1 << 20):
                        out.write(block)
                # Keep the executable bit (zip from Unix hosts records it); drop setuid and friends.
                os.chmod(target, 0o755 if mode & 0o111 else 0o644)
    except zipfile.BadZipFile as exc:
        raise UnsafeArchive(f"{archive.name}: not a readable zip archive: {exc}") from None


def _inside(root: str, real: str, entry: str) -> None:
    if real != root and not real.startswith(root + os.sep):
        raise UnsafeArchive(f"entry {entry!r}: resolves outside the install directory through a link")


def _verify_tree(dest: Path) -> None:
    root = dest.resolve()
    for dirpath, dirnames, filenames in os.walk(dest):
        for entry in [*dirnames, *filenames]:
            path = Path(dirpath) / entry
            if path.is_symlink():
                real = path.resolve()
                if real != root and root not in real.parents:
                    raise UnsafeArchive(f"entry {str(path.relative_to(dest))!r}: link resolves outside "
                                        "the install directory")


def safe_unpack(archive: Path, dest: Path) -> None:
    """Unpack ``archive`` (by its name: .tar.gz/.tgz/.tar or .zip) into the existing directory ``dest``."""
    if archive.name.endswith(".zip"):
        _unpack_zip(archive, dest)
    else:
        _unpack_tar(archive, dest)
    _verify_tree(dest)
