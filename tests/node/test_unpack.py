"""Archive attacks: each is refused naming the entry, and nothing lands outside the directory."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from node import hostile
from node.helpers import small_filesystem

from llmgw_node.engines.unpack import UnpackLimits, UnsafeArchive, safe_unpack


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
    (
        "symlink-out",
        lambda: [_special("top/lib", tarfile.SYMTYPE, "../../etc")],
        "entry 'top/lib': symlink to '../../etc' points outside the install directory",
    ),
    (
        "symlink-abs",
        lambda: [_special("top/passwd", tarfile.SYMTYPE, "/etc/passwd")],
        "entry 'top/passwd': symlink to absolute path '/etc/passwd'",
    ),
    (
        "hardlink-out",
        lambda: [_special("top/h", tarfile.LNKTYPE, "../outside")],
        "entry 'top/h': hardlink to '../outside' points outside the install directory",
    ),
    (
        "hardlink-abs",
        lambda: [_special("top/h", tarfile.LNKTYPE, "/etc/shadow")],
        "entry 'top/h': hardlink to absolute path '/etc/shadow'",
    ),
    ("chardev", lambda: [_special("top/null", tarfile.CHRTYPE)], "entry 'top/null': device file"),
    ("blockdev", lambda: [_special("top/sda", tarfile.BLKTYPE)], "entry 'top/sda': device file"),
    ("fifo", lambda: [_special("top/pipe", tarfile.FIFOTYPE)], "entry 'top/pipe': fifo"),
    # A link that is fine on its own, followed by a file written through it.
    (
        "write-through-link",
        lambda: [_special("top/d", tarfile.SYMTYPE, ".."), _file("top/d/../x")],
        "entry 'top/d/../x': '..' component",
    ),
    # Two links that each stay inside on paper, chained to leave, then a file written through both.
    (
        "link-chain",
        lambda: [
            _special("top/d", tarfile.SYMTYPE, ".."),
            _special("top/d/e", tarfile.SYMTYPE, ".."),
            _file("top/d/e/pwned"),
        ],
        "entry 'top/d/e",
    ),
]


@pytest.mark.parametrize(("attack", "entries", "message"), TAR_ATTACKS, ids=[a[0] for a in TAR_ATTACKS])
def test_tar_attacks_are_refused_naming_the_entry(
    tmp_path: Path,
    attack: str,
    entries: Callable[[], list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]],
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
    archive = _tar(
        tmp_path / "ok.tar.gz",
        [
            _file("top/lib/libx.so.1", b"lib"),
            _special("top/libx.so", tarfile.SYMTYPE, "lib/libx.so.1"),
            _special("top/hard", tarfile.LNKTYPE, "top/lib/libx.so.1"),
        ],
    )
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
        (
            [("top/d", b"..", 0o120777), ("top/d/e", b"..", 0o120777), ("top/d/e/pwned", b"x", 0o100644)],
            "entry 'top/d/e",
        ),
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
    archive = _zip(
        tmp_path / "ok.zip",
        [
            ("top/", b"", 0o040755),
            ("top/llama-server", b"bin", 0o100755),
            ("top/README", b"doc", 0o100644),
            ("top/alias", b"llama-server", 0o120777),
        ],
    )
    dest = tmp_path / "dest"
    dest.mkdir()
    safe_unpack(archive, dest)
    assert os.access(dest / "top" / "llama-server", os.X_OK)
    assert not os.access(dest / "top" / "README", os.X_OK)
    assert (dest / "top" / "alias").resolve() == (dest / "top" / "llama-server").resolve()


# --------------------------------------------------------------------------- issue 14: by construction


def _nested_dest(tmp_path: Path, levels: int = 4) -> Path:
    """A destination ``levels`` folders below ``tmp_path``: an escape lands in the test's own folder."""
    dest = tmp_path.joinpath(*[f"up{i}" for i in range(levels)], "dest")
    dest.mkdir(parents=True)
    return dest


def _everything_under(root: Path) -> set[str]:
    # os.walk does not follow links: it lists what is really there, even past PATH_MAX.
    return {os.path.join(d, n) for d, dirs, names in os.walk(root) for n in [*dirs, *names]}


@pytest.mark.parametrize(
    ("suffix", "build"),
    [(".tar.gz", hostile.pathmax_escape_tar), (".zip", hostile.pathmax_escape_zip)],
    ids=["tar", "zip"],
)
def test_links_past_path_max_cannot_write_outside(tmp_path: Path, suffix: str, build: Callable[[int], bytes]) -> None:
    archive = tmp_path / f"escape{suffix}"
    archive.write_bytes(build(4))
    dest = _nested_dest(tmp_path)
    outside = _everything_under(tmp_path) - {str(dest)}
    with pytest.raises(UnsafeArchive) as info:
        safe_unpack(archive, dest)
    assert str(info.value).startswith("entry '")
    assert not (tmp_path / "PWNED").exists()
    assert {p for p in _everything_under(tmp_path) if not p.startswith(str(dest))} == outside


def test_a_hardlink_cannot_reach_or_chmod_a_file_outside(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    archive = tmp_path / "h.tar.gz"
    archive.write_bytes(hostile.hardlink_chmod_tar(4, "victim"))
    dest = _nested_dest(tmp_path)
    with pytest.raises(UnsafeArchive, match=r"^entry '"):
        safe_unpack(archive, dest)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert victim.stat().st_nlink == 1


def test_a_hardlink_only_to_a_file_earlier_in_the_archive(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    for entries, message in [
        (
            [_special("top/h", tarfile.LNKTYPE, "top/later"), _file("top/later")],
            "entry 'top/h': hardlink to 'top/later', which is not a file earlier in the archive",
        ),
        (
            [_special("top/h", tarfile.LNKTYPE, "top")],
            "entry 'top/h': hardlink to 'top', which is not a file earlier in the archive",
        ),
    ]:
        with pytest.raises(UnsafeArchive) as info:
            safe_unpack(_tar(tmp_path / "h.tar.gz", [_file("top/llama-server"), *entries]), dest)
        assert str(info.value) == message
        assert list(dest.iterdir()) == []


def test_links_that_leave_only_together_are_refused(tmp_path: Path) -> None:
    # sub/up -> .. and esc -> sub/up/.. each stay inside read as text; the kernel takes esc to
    # the parent of the top. Resolved as the kernel does, through the archive's own links.
    archive = tmp_path / "chain.tar.gz"
    archive.write_bytes(hostile.link_chain_escape_tar())
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UnsafeArchive) as info:
        safe_unpack(archive, dest)
    assert str(info.value) == "entry 'esc': resolves outside the install directory through a link"
    assert list(dest.iterdir()) == []


def test_a_second_archive_cannot_leave_through_the_first_ones_links(tmp_path: Path) -> None:
    # The CUDA build and its runtime unpack into one staging folder: the second archive's links
    # are resolved against what is on disk, links of the first included.
    dest = tmp_path / "dest"
    dest.mkdir()
    safe_unpack(
        _tar(tmp_path / "one.tar.gz", [_file("top/llama-server"), _special("sub/up", tarfile.SYMTYPE, "..")]), dest
    )
    with pytest.raises(UnsafeArchive) as info:
        safe_unpack(_tar(tmp_path / "two.tar.gz", [_special("esc", tarfile.SYMTYPE, "sub/up/..")]), dest)
    assert "'esc'" in str(info.value) and "outside the install directory" in str(info.value)
    with pytest.raises(UnsafeArchive) as info:
        safe_unpack(_tar(tmp_path / "three.tar.gz", [_file("sub/up/PWNED")]), dest)
    assert str(info.value).startswith("entry 'sub/up/PWNED': ")
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    ("suffix", "build", "message"),
    [
        (".zip", hostile.duplicate_zip, "entry 'top/llama-server': appears twice in the archive"),
        (".tar.gz", hostile.nul_name_tar, "entry 'top/a\\x00b': NUL in the name"),
        (".tar.gz", hostile.long_name_tar, f"entry 'top/{'n' * 192}...: a name longer than 255 bytes"),
        (".tar.gz", hostile.long_path_tar, "path longer than 1024 bytes"),
        (".tar.gz", hostile.truncated_tar_gz, "trunc.tar.gz: not a readable tar archive: "),
    ],
    ids=["duplicate", "nul", "long-name", "long-path", "truncated"],
)
def test_broken_archives_are_refusals_not_crashes(
    tmp_path: Path, suffix: str, build: Callable[[], bytes], message: str
) -> None:
    archive = tmp_path / f"trunc{suffix}"
    archive.write_bytes(build())
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UnsafeArchive) as info:
        safe_unpack(archive, dest)
    assert message in str(info.value)


def test_a_truncated_zip_is_a_refusal(tmp_path: Path) -> None:
    whole = hostile.zip_archive([("top/llama-server", bytes(range(256)) * 100, 0o100755)])
    for cut in (len(whole) // 2, len(whole) - 10, 30):
        archive = tmp_path / "cut.zip"
        archive.write_bytes(whole[:cut])
        dest = tmp_path / f"dest{cut}"
        dest.mkdir()
        with pytest.raises(UnsafeArchive, match=r"^cut\.zip: not a readable zip archive: "):
            safe_unpack(archive, dest)


def test_entry_and_size_caps_refuse_before_writing(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    many = _tar(tmp_path / "many.tar.gz", [_file(f"top/f{i}") for i in range(11)])
    with pytest.raises(UnsafeArchive) as info:
        safe_unpack(many, dest, UnpackLimits(max_entries=10))
    assert str(info.value) == "many.tar.gz: more than 10 entries (unpack_max_entries)"
    big = tmp_path / "big.tar.gz"
    big.write_bytes(hostile.gzip_bomb(64 << 20))
    with pytest.raises(UnsafeArchive) as info:
        safe_unpack(big, dest, UnpackLimits(max_bytes=32 << 20))
    assert str(info.value) == "big.tar.gz: unpacks to more than 32 MB (unpack_max_bytes), at entry 'top/zeros'"
    assert list(dest.iterdir()) == []
    safe_unpack(many, dest, UnpackLimits(max_entries=11))  # at the cap is fine


def test_a_gzip_bomb_is_refused_before_it_fills_a_small_disk(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(hostile.gzip_bomb(256 << 20))
    with small_filesystem(tmp_path / "disk", "64m") as disk:
        dest = disk / "staging"
        dest.mkdir()
        free = shutil.disk_usage(disk).free
        with pytest.raises(UnsafeArchive) as info:
            safe_unpack(bomb, dest, UnpackLimits(keep_free=1 << 20))
        assert str(info.value).startswith(
            "not enough disk for unpacking bomb.tar.gz: needs 257 MB (with 1 MB kept free), 64 MB free in "
        )
        assert list(dest.iterdir()) == [] and shutil.disk_usage(disk).free == free
        # The same disk takes an archive that fits.
        safe_unpack(
            _tar(tmp_path / "ok.tar.gz", [_file("top/llama-server", b"x" * 1000)]),
            dest,
            UnpackLimits(keep_free=1 << 20),
        )


def test_a_disk_that_runs_out_while_unpacking_is_a_refusal(tmp_path: Path) -> None:
    # Bytes are checked before unpacking; files (inodes) run out on the way, like a disk another
    # writer fills meanwhile. Either way: a clear reason, never an OSError.
    archive = _tar(tmp_path / "files.tar.gz", [_file(f"top/f{i}") for i in range(40)])
    with small_filesystem(tmp_path / "disk", "16m", inodes=20) as disk:
        dest = disk / "staging"
        dest.mkdir()
        with pytest.raises(UnsafeArchive) as info:
            safe_unpack(archive, dest, UnpackLimits(keep_free=0))
    assert str(info.value).startswith("files.tar.gz: the disk ran out at entry 'top/f")


# Few names, so entries collide, nest in each other and links find each other; '..' and '/' in
# targets, so links point up, across and out.
NAME_PARTS = ["top", "a", "lib", "x", ".", "..", "", "x\x00"]
TARGET_PARTS = ["..", "..", ".", "a", "top", "lib", "x", "", "/"]


@st.composite
def _hostile_entries(draw: st.DrawFn) -> list[tuple[str, str, str]]:
    name = st.lists(st.sampled_from(NAME_PARTS), min_size=1, max_size=4).map("/".join)
    target = st.lists(st.sampled_from(TARGET_PARTS), min_size=1, max_size=6).map("/".join)
    kind = st.sampled_from(["file", "dir", "symlink", "hardlink"])
    return draw(st.lists(st.tuples(kind, name, target), min_size=1, max_size=8))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=_hostile_entries(), as_zip=st.booleans())
# Shapes random draws rarely reach: links that leave only together, and a write through them.
@example(entries=[("symlink", "a/x", ".."), ("symlink", "top", "a/x/..")], as_zip=False)
@example(entries=[("symlink", "a/x", ".."), ("symlink", "top", "a/x/..")], as_zip=True)
@example(entries=[("symlink", "a/x", ".."), ("symlink", "top", "a/x/.."), ("file", "top/x", "")], as_zip=False)
@example(entries=[("symlink", "a", "."), ("symlink", "x", "a/a/a/a/.."), ("hardlink", "lib", "x/top")], as_zip=False)
def test_whatever_the_archive_nothing_lands_outside(
    tmp_path: Path, entries: list[tuple[str, str, str]], as_zip: bool
) -> None:
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    dest = _nested_dest(work, 2)
    archive = work / ("a.zip" if as_zip else "a.tar.gz")
    if as_zip:
        modes = {"file": 0o100644, "dir": 0o040755, "symlink": 0o120777, "hardlink": 0o100644}
        archive.write_bytes(
            hostile.zip_archive(
                [
                    (name + ("/" if kind == "dir" else ""), target.encode() if kind == "symlink" else b"z", modes[kind])
                    for kind, name, target in entries
                    if name
                ]
            )
        )
    else:
        types = {
            "file": tarfile.REGTYPE,
            "dir": tarfile.DIRTYPE,
            "symlink": tarfile.SYMTYPE,
            "hardlink": tarfile.LNKTYPE,
        }
        archive.write_bytes(
            hostile.tar_gz(
                [
                    (
                        name,
                        {
                            "kind": types[kind],
                            "linkname": target if "link" in kind else "",
                            **({"data": b"z"} if kind == "file" else {}),
                        },
                    )
                    for kind, name, target in entries
                ]
            )
        )
    before = _everything_under(work) - {str(dest)}
    with contextlib.suppress(UnsafeArchive):
        safe_unpack(archive, dest)
    assert {p for p in _everything_under(work) if not p.startswith(str(dest) + "/")} - {str(dest)} == before
    for path in _everything_under(dest):
        if os.path.islink(path):
            real = os.path.realpath(path)
            assert real == str(dest.resolve()) or real.startswith(str(dest.resolve()) + "/"), (path, real)
        else:
            assert os.path.isdir(path) or os.path.isfile(path)
