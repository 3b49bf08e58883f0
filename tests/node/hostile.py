"""Hostile engine archives, one builder per class of attack, shared by the unpack, CLI and daemon tests.

Each builder returns the archive's bytes. Archives that try to write outside aim at a place a
few folders above the directory they are unpacked into (``levels`` up), named ``PWNED``: a test
unpacks into a directory nested that deep inside its own ``tmp_path``, so a hole in the
extractor writes into the test's directory, never anywhere else on the machine.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import warnings
import zipfile

# A folder name of 250 characters: 17 of them nested are longer than PATH_MAX (4096), which is
# where os.path.realpath gives up and starts treating links as plain names.
LONG = "d" * 250
STEPS = "abcdefghijklmnopq"
SHORT_LINK = "l" * 250


def _add(
    tar: tarfile.TarFile,
    name: str,
    *,
    kind: bytes = tarfile.REGTYPE,
    data: bytes = b"",
    linkname: str = "",
    mode: int = 0o644,
    pax: dict[str, str] | None = None,
) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = mode
    if pax:
        info.pax_headers = pax
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def tar_gz(build: list[tuple[str, dict[str, object]]], *, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar.gz from ``(name, options for _add)`` pairs."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=fmt) as tar:
        for name, options in build:
            _add(tar, name, **options)  # type: ignore[arg-type]
    return out.getvalue()


def _pathmax_links(levels: int) -> list[tuple[str, str, bytes]]:
    """(name, kind, link target) entries of the PATH_MAX link escape (CVE-2025-4517's shape).

    ``LONG/``, ``a -> LONG``, ``a/LONG/``, ``a/b -> LONG``, ...: the short path ``a/b/.../q``
    is 17 links deep and names a directory whose real path is past PATH_MAX. ``a/.../q/<short>`` points 17 levels up,
    back to the top; ``escape`` goes through it and then ``levels`` further up. realpath stops
    resolving links past PATH_MAX and calls ``escape`` inside; the kernel follows it outside.
    """
    entries: list[tuple[str, str, bytes]] = []
    path = ""
    for step in STEPS:
        entries.append((f"{path}{LONG}/", "dir", b""))
        entries.append((f"{path}{step}", "symlink", LONG.encode()))
        # The next folder is named through the link: names stay short while the real path grows.
        path = f"{path}{step}/"
    link_path = "/".join(STEPS) + "/" + SHORT_LINK
    entries.append((link_path, "symlink", "/".join([".."] * len(STEPS)).encode()))
    entries.append(("escape", "symlink", (link_path + "/.." * levels).encode()))
    return entries


def pathmax_escape_tar(levels: int, *, top: str = "top") -> bytes:
    """The PATH_MAX link escape, then ``escape/PWNED`` written through it."""
    build: list[tuple[str, dict[str, object]]] = [(f"{top}/llama-server", {"data": b"bin", "mode": 0o755})]
    for name, kind, target in _pathmax_links(levels):
        if kind == "dir":
            build.append((name.rstrip("/"), {"kind": tarfile.DIRTYPE, "mode": 0o755}))
        else:
            build.append((name, {"kind": tarfile.SYMTYPE, "linkname": target.decode()}))
    build.append(("escape/PWNED", {"data": b"pwned"}))
    return tar_gz(build)


def hardlink_chmod_tar(levels: int, victim: str) -> bytes:
    """The PATH_MAX escape, then a hardlink through it to ``victim`` (``levels`` up), mode 0644.

    Extracting a hardlink makes the link and then sets the entry's mode on it, which is the
    victim's inode: a 0600 file outside becomes 0644 (as root, /etc/shadow made world-readable).
    """
    build: list[tuple[str, dict[str, object]]] = []
    for name, kind, target in _pathmax_links(levels):
        if kind == "dir":
            build.append((name.rstrip("/"), {"kind": tarfile.DIRTYPE, "mode": 0o755}))
        else:
            build.append((name, {"kind": tarfile.SYMTYPE, "linkname": target.decode()}))
    build.append(("h", {"kind": tarfile.LNKTYPE, "linkname": f"escape/{victim}", "mode": 0o644}))
    return tar_gz(build)


def pathmax_escape_zip(levels: int, *, top: str = "top") -> bytes:
    """The same link escape as a zip (links are entries with S_IFLNK in their Unix mode)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        _zip_entry(zf, f"{top}/llama-server", b"bin", 0o100755)
        for name, kind, target in _pathmax_links(levels):
            if kind == "dir":
                _zip_entry(zf, name, b"", 0o040755)
            else:
                _zip_entry(zf, name, target, 0o120777)
        _zip_entry(zf, "escape/PWNED", b"pwned", 0o100644)
    return out.getvalue()


def link_chain_escape_tar() -> bytes:
    """Short links that each stay inside on paper and leave together: ``sub/up -> ..``,
    ``esc -> sub/up/..`` (lexically ``sub``; the kernel goes to the parent of the top)."""
    return tar_gz(
        [
            ("top/llama-server", {"data": b"bin", "mode": 0o755}),
            ("sub/up", {"kind": tarfile.SYMTYPE, "linkname": ".."}),
            ("esc", {"kind": tarfile.SYMTYPE, "linkname": "sub/up/.."}),
        ]
    )


def _zip_entry(zf: zipfile.ZipFile, name: str, data: bytes, mode: int) -> None:
    info = zipfile.ZipInfo(name)
    info.create_system = 3  # Unix: the mode in external_attr counts
    info.external_attr = mode << 16
    zf.writestr(info, data)


def zip_archive(entries: list[tuple[str, bytes, int]]) -> bytes:
    out = io.BytesIO()
    # zipfile writes a name twice when asked, warning about it: hostile archives ask.
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w") as zf:
        warnings.simplefilter("ignore")
        for name, data, mode in entries:
            _zip_entry(zf, name, data, mode)
    return out.getvalue()


def duplicate_zip(top: str = "top") -> bytes:
    """Two regular entries with the same name."""
    return zip_archive([(f"{top}/llama-server", b"bin", 0o100755), (f"{top}/llama-server", b"again", 0o100755)])


def nul_name_tar(top: str = "top") -> bytes:
    """A pax ``path`` record may hold a NUL, which no file name can."""
    return tar_gz(
        [
            (f"{top}/llama-server", {"data": b"bin", "mode": 0o755}),
            ("x", {"data": b"x", "pax": {"path": f"{top}/a\x00b"}}),
        ]
    )


def long_name_tar(top: str = "top") -> bytes:
    """One name component over NAME_MAX (255 bytes)."""
    return tar_gz([(f"{top}/llama-server", {"data": b"bin", "mode": 0o755}), (f"{top}/{'n' * 300}", {"data": b"x"})])


def long_path_tar(top: str = "top") -> bytes:
    """A path over PATH_MAX (4096 bytes) made of short enough components."""
    deep = "/".join(["p" * 200] * 25)
    return tar_gz([(f"{top}/llama-server", {"data": b"bin", "mode": 0o755}), (f"{top}/{deep}/f", {"data": b"x"})])


def truncated_tar_gz(top: str = "top") -> bytes:
    """A real archive cut in the middle of its gzip stream."""
    whole = tar_gz(
        [
            (f"{top}/llama-server", {"data": bytes(range(256)) * 400, "mode": 0o755}),
            (f"{top}/lib.so", {"data": bytes(reversed(range(256))) * 400}),
        ]
    )
    return whole[: len(whole) // 2]


def gzip_bomb(declared: int, top: str = "top") -> bytes:
    """A tar.gz holding one file of ``declared`` zero bytes: about a thousandth of that on the wire."""
    out = io.BytesIO()
    header = tarfile.TarInfo(f"{top}/zeros")
    header.size = declared
    block = bytes(1 << 20)
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1) as gz:
        gz.write(header.tobuf(format=tarfile.PAX_FORMAT))
        left = declared
        while left:
            n = min(left, len(block))
            gz.write(block[:n])
            left -= n
        gz.write(bytes(-declared % 512))  # pad the member to a whole block
        gz.write(bytes(1024))  # the two zero blocks that end a tar
    return out.getvalue()


def engine_archive_cases(top: str) -> list[tuple[str, str, bytes, str]]:
    """(case, archive suffix, bytes, words the refusal must contain) for every class an engine
    install must refuse; ``top`` is the release's top folder (``llama-<tag>``)."""
    return [
        ("pathmax-tar", ".tar.gz", pathmax_escape_tar(4, top=top), "failed: entry '"),
        ("pathmax-zip", ".zip", pathmax_escape_zip(4, top=top), "failed: entry '"),
        ("hardlink-chmod", ".tar.gz", hardlink_chmod_tar(4, "victim"), "failed: entry '"),
        (
            "link-chain",
            ".tar.gz",
            link_chain_escape_tar(),
            "failed: entry 'esc': resolves outside the install directory through a link",
        ),
        ("duplicate", ".zip", duplicate_zip(top), f"failed: entry '{top}/llama-server': appears twice in the archive"),
        ("nul", ".tar.gz", nul_name_tar(top), f"failed: entry '{top}/a\\x00b': NUL in the name"),
        ("long-name", ".tar.gz", long_name_tar(top), ": a name longer than 255 bytes"),
        ("long-path", ".tar.gz", long_path_tar(top), ": path longer than 1024 bytes"),
        ("truncated", ".tar.gz", truncated_tar_gz(top), "not a readable tar archive: EOFError: "),
    ]
