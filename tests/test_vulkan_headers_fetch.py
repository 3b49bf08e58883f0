"""The Vulkan build's headers: Debian 13's libvulkan-dev fetched with apt-get from a source list of
its own, checked against the pinned sha256, unpacked into the cache (tools/llmgw_dev/build_engine.py).

Offline: ``apt-get``, ``dpkg`` and ``dpkg-deb`` are scripts on PATH that record what they were asked.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llmgw_dev import build_engine

DEB = b"!<arch>\nnot really a deb\n"
APT_GET = """#!/bin/sh
echo "$@" >> "$LOG"
case "$*" in *" download "*) printf '%s' "$DEB_BYTES" > libvulkan-dev_1.4.309.0-1_amd64.deb ;; esac
"""
DPKG_DEB = """#!/bin/sh
mkdir -p "$3/usr/include/vulkan" && echo '#define VK_HEADER_VERSION 309' > "$3/usr/include/vulkan/vulkan_core.h"
"""


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("apt-get", APT_GET), ("dpkg-deb", DPKG_DEB), ("dpkg", "#!/bin/sh\necho amd64\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "apt.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("LOG", str(log))
    monkeypatch.setenv("DEB_BYTES", DEB.decode())
    monkeypatch.setenv("LLMGW_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LLMGW_VULKAN_INCLUDE", raising=False)
    return log


def test_a_deb_that_is_not_the_pinned_one_is_refused_and_nothing_is_unpacked(tools: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"sha256 [0-9a-f]{64} is not the pinned 8d329d46.*refusing it"):
        build_engine.fetch_vulkan_headers()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".vulkan-headers.lock"]


def test_the_pinned_deb_is_unpacked_once_without_the_systems_apt_configuration(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(build_engine.VULKAN_DEV, "amd64", ("1.4.309.0-1", hashlib.sha256(DEB).hexdigest()))
    target = build_engine.fetch_vulkan_headers()
    assert target == tmp_path / "cache" / "vulkan-headers"
    assert build_engine.vulkan_flags() == [f"-DVulkan_INCLUDE_DIR={target / 'usr' / 'include'}"]
    update, download = tools.read_text().splitlines()
    for line in (update, download):
        assert "Dir::Etc::sourceparts=-" in line
        for option in ("Dir::Etc::sourcelist", "Dir::State::Lists", "Dir::Cache"):
            value = line.split(f"{option}=")[1].split()[0]
            assert value.startswith(str(tmp_path / "cache")), (option, value)
    assert update.endswith(" update") and download.endswith(" download libvulkan-dev=1.4.309.0-1")
    build_engine.fetch_vulkan_headers()
    assert len(tools.read_text().splitlines()) == 2  # unpacked already: apt-get not run again
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".vulkan-headers.lock", "vulkan-headers"]
