"""A GitHub-shaped release index: which asset of a release fits this node.

GitHub's ``/repos/<owner>/<repo>/releases/tags/<tag>`` JSON lists ``assets`` with ``name``,
``size``, ``browser_download_url`` and ``digest`` (``"sha256:<hex>"``). Any mirror serving the
same shape works, which is how air-gapped clusters and the tests do it.

llama.cpp names its builds ``llama-<tag>-bin-<os>[-<variant>]-<arch>.<tar.gz|zip>``; a CUDA
build on Windows also needs ``cudart-llama-bin-<os>-cuda-<ver>-<arch>.zip``.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".zip")
_LINUX_NAMES = ("linux", "ubuntu")
_ARCH_NAMES = {"x86_64": ("x64", "x86_64", "amd64"), "aarch64": ("arm64", "aarch64")}
_NAME = re.compile(
    r"^(?P<prefix>llama-[^-]+|cudart-llama)-bin-(?P<rest>.+?)(?P<suffix>\.tar\.gz|\.tgz|\.zip)$"
)


class ReleaseError(Exception):
    """The release index is unusable, or nothing in it fits this node."""


@attrs.frozen
class ReleaseAsset:
    name: str
    url: str
    size: int
    sha256: str


@attrs.frozen
class Platform:
    os: str  # "linux"
    arch: str  # "x86_64" | "aarch64"
    cuda: bool  # an NVIDIA driver is loaded


def parse_release(data: Any) -> list[ReleaseAsset]:
    if not isinstance(data, dict) or not isinstance(data.get("assets"), list):
        raise ReleaseError("release JSON has no 'assets' list")
    assets = []
    for item in data["assets"]:
        if not isinstance(item, dict):
            continue
        name, url, digest = item.get("name"), item.get("browser_download_url"), item.get("digest")
        size = item.get("size")
        if not (isinstance(name, str) and isinstance(url, str)):
            continue
        sha = ""
        if isinstance(digest, str) and digest.lower().startswith("sha256:"):
            sha = digest.split(":", 1)[1].strip().lower()
        assets.append(ReleaseAsset(name=name, url=url, size=size if isinstance(size, int) else 0, sha256=sha))
    return assets


@attrs.frozen
class _Parsed:
    asset: ReleaseAsset
    cudart: bool
    os: str
    variant: str
    arch: str


def _parse_name(asset: ReleaseAsset) -> _Parsed | None:
    m = _NAME.fullmatch(asset.name)
    if not m:
        return None
    parts = m["rest"].split("-")
    if len(parts) < 2:
        return None
    return _Parsed(asset=asset, cudart=m["prefix"] == "cudart-llama", os=parts[0],
                   variant="-".join(parts[1:-1]), arch=parts[-1])


def _why_not(p: _Parsed, plat: Platform) -> str:
    if plat.os == "linux" and p.os not in _LINUX_NAMES:
        return f"built for {p.os}"
    if p.arch not in _ARCH_NAMES.get(plat.arch, (plat.arch,)):
        return f"built for {p.arch}"
    if p.variant.startswith("cuda") and not plat.cuda:
        return "a CUDA build and this node has no NVIDIA driver"
    if p.variant not in ("", "cpu") and not p.variant.startswith("cuda"):
        return f"a {p.variant} build, which this node does not use"
    return ""


def choose_assets(assets: list[ReleaseAsset], plat: Platform) -> list[ReleaseAsset]:
    """The archives to install for ``plat``: one build, plus its CUDA runtime when it needs one.

    On a node with an NVIDIA driver a CUDA build is preferred (newest CUDA version first) and
    the CPU build is the fallback. When nothing fits, the error lists each asset and why not.
    """
    parsed = [p for p in (_parse_name(a) for a in assets) if p is not None]
    fitting = [p for p in parsed if not p.cudart and not _why_not(p, plat)]
    if plat.cuda:
        cuda = sorted((p for p in fitting if p.variant.startswith("cuda")), key=lambda p: p.variant,
                      reverse=True)
        for build in cuda:
            runtime = [r for r in parsed if r.cudart and r.variant == build.variant and not _why_not(r, plat)]
            return [build.asset, *(r.asset for r in runtime[:1])]
    cpu = [p for p in fitting if p.variant in ("", "cpu")]
    if cpu:
        # Prefer tar.gz over zip on Linux: it keeps file modes.
        cpu.sort(key=lambda p: not p.asset.name.endswith((".tar.gz", ".tgz")))
        return [cpu[0].asset]
    reasons = []
    for a in assets:
        p = _parse_name(a)
        if p is None:
            reasons.append(f"{a.name} (not a llama.cpp build archive)")
        elif p.cudart:
            reasons.append(f"{a.name} (a CUDA runtime, not a build)")
        else:
            reasons.append(f"{a.name} ({_why_not(p, plat) or 'no reason'})")
    offered = "; ".join(reasons) if reasons else "the release has no assets"
    raise ReleaseError(f"no asset fits {plat.os}/{plat.arch}{' with CUDA' if plat.cuda else ''}: {offered}")
