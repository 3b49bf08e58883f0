"""Archive attacks: each is refused naming the entry, and nothing lands outside the directory."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw_node.engines.unpack import UnsafeArchive, safe_unpack


def _tar(path: Path, entries: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for entry in entries:
            if isinstance(entry, tuple):
                info, data = entry
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(entry)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = 0o755
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


TAR_ATTACKS: list[tuple[str, Callable[[], list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]], str]] = [
    ("absolute", lambda: [_file("/tmp/llmgw-pwned")], "entry '/tmp/llmgw-pwned': absolute path"),
    ("dotdot", lambda: [_file("top/../../escape")], "entry 'top/../../escape': '..' component"),
    ("symlink-out", lambda: [_special("top/lib", tarfile.SYMTYPE, "../../etc")],
     "entry 'top/lib': symlink to '../../etc' points outside the install directory"),
    ("symlink-abs", lambda: [_special("top/passwd", tarfile.SYMTYPE, "/etc/passwd")],
     "entry 'top/passwd': symlink to absolute path '/etc/passwd'"),
    ("hardlink-out", lambda: [_special("top/h", tarfile.LNKTYPE, "../outside")],
     "entry 'top/h': hardlink to '../outside' points outside the install directory"),
    ("hardlink-abs", lambda: [_special("top/h", tarfile.LNKTYPE, "/etc/shadow")],
     "entry 'top/h': hardlink to absolute path '/etc/shadow'"),
    ("chardev", lambda: [_special("top/null", tarfile.CHRTYPE)], "entry 'top/null': device file"),
    ("blockdev", lambda: [_special("top/sda", tarfile.BLKTYPE)], "entry 'top/sda': device file"),
    ("fifo", lambda: [_special("top/pipe", tarfile.FIFOTYPE)], "entry 'top/pipe': fifo"),
    # A link that is fine on its own, followed by a file written through it.
    ("write-through-link", lambda: [_special("top/d", tarfile.SYMTYPE, ".."), _file("top/d/../x")],
     "entry 'top/d/../x': '..' component"),
    # Two links that each stay inside on paper, chained to leave, then a file written through both.
    ("link-chain", lambda: [_special("top/d", tarfile.SYMTYPE, ".."), _special("top/d/e", tarfile.SYMTYPE, ".."),
                            _file("top/d/e/pwned")],
     "entry 'top/d/e"),
]


@pytest.mark.parametrize(("attack", "entries", "message"), TAR_ATTACKS, ids=[a[0] for a in TAR_ATTACKS])
def test_tar_attacks_are_refused_naming_the_entry(
    tmp_path: Path, attack: str, entries: Callable[[], list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]],
    message: str,
) -> None:
    archive = _tar(tmp_path / f"{attack}.tar.gz", [_file("top/llama-server"), *entries()])
    dest = tmp_path / "dest"
    dest.mkdir()
    before = set(os.listdir(tmp_path))
    with pytest.raises(UnsafeArchive) as info:
        safe_unpack(archive, dest)
    assert message in str(info.value)
    if attack != "link-chain":
        # Checked before anything was written: the destination is still empty.
        assert list(dest.iterdir()) == []
    # A chain of links is caught while unpacking (the installer deletes its staging dir then);
    # either way nothing appeared outside the destination.
    assert set(os.listdir(tmp_path)) == before
    assert not Path("/tmp/llmgw-pwned").exists()


def test_links_inside_the_directory_are_fine(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "ok.tar.gz", [
        _file("top/lib/libx.so.1", b"lib"),
        _special("top/libx.so", tarfile.SYMTYPE, "lib/libx.so.1"),
        _special("top/hard", tarfile.LNKTYPE, "top/lib/libx.so.1"),
    ])
    dest = tmp_path / "dest"
    dest.mkdir()
    safe_unpack(archive, dest)
    assert (dest / "top" / "libx.so").read_bytes() == b"lib"
    assert (dest / "top" / "hard").read_bytes() == b"lib"


def test_setuid_bits_are_dropped(tmp_path: Path) -> None:
    info, data = _file("top/tool")
    info.mode = 0o4755
    dest = tmp_path / "dest"
    dest.mkdir()
    safe_unpack(_tar(tmp_path / "s.tar.gz", [(info, data)]), dest)
    mode = (dest / "top" / "tool").stat().st_mode
    assert not mode & stat.S_ISUID and mode & stat.S_IXUSR


def test_not_an_archive_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"<html>rate limited</html>")
    with pytest.raises(UnsafeArchive, match=r"x\.tar\.gz: not a readable tar archive"):
        safe_unpack(bad, tmp_path)


def _zip(path: Path, entries: list[tuple[str, bytes, int]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([("/abs/file", b"x", 0o100644)], "entry '/abs/file': absolute path"),
        ([("top/../../up", b"x", 0o100644)], "entry 'top/../../up': '..' component"),
        ([("top/link", b"../../etc", 0o120777)], "entry 'top/link': symlink to '../../etc' points outside"),
        ([("top/link", b"/etc/passwd", 0o120777)], "entry 'top/link': symlink to absolute path '/etc/passwd'"),
        ([("top/fifo", b"", 0o010644)], "entry 'top/fifo': fifo"),
        ([("top/dev", b"", 0o020644)], "entry 'top/dev': device file"),
        ([("C:/windows/x", b"", 0o100644)], "entry 'C:/windows/x': absolute path"),
        ([("top/d", b"..", 0o120777), ("top/d/e", b"..", 0o120777), ("top/d/e/pwned", b"x", 0o100644)],
         "entry 'top/d/e"),
    ],
)
def test_zip_attacks_are_refused_naming_the_entry(
    tmp_path: Path, entries: list[tuple[str, bytes, int]], message: str
) -> None:
    archive = _zip(tmp_path / "a.zip", [("top/llama-server", b"bin", 0o100755), *entries])
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UnsafeArchive) as info:
        safe_unpack(archive, dest)
    assert message in str(info.value)
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "up").exists()
    assert sorted(os.listdir(tmp_path)) == ["a.zip", "dest"]


def test_zip_keeps_executable_bits_and_inside_links(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "ok.zip", [
        ("top/", b"", 0o040755),
        ("top/llama-server", b"bin", 0o100755),
        ("top/README", b"doc", 0o100644),
        ("top/alias", b"llama-server", 0o120777),
    ])
    dest = tmp_path / "dest"
    dest.mkdir()
    safe_unpack(archive, dest)
    assert os.access(dest / "top" / "llama-server", os.X_OK)
    assert not os.access(dest / "top" / "README", os.X_OK)
    assert (dest / "top" / "alias").resolve() == (dest / "top" / "llama-server").resolve()
