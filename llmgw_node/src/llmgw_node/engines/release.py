"""A GitHub-shaped release index: which asset of a release fits this node.

GitHub's ``/repos/<owner>/<repo>/releases/tags/<tag>`` JSON lists ``assets`` with ``name``,
``size``, ``browser_download_url`` and ``digest`` (``"sha256:<hex>"``). Any mirror serving the
same shape works, which is how air-gapped clusters and the tests do it.

llama.cpp names its builds ``llama-<tag>-bin-<os>[-<variant>]-<arch>.<tar.gz|zip>``; a CUDA
build on Windows also needs ``cudart-llama-bin-<os>-cuda-<ver>-<arch>.zip``.

The index comes from the network: every asset's name must be a plain file name
(``llmgw_shared.names.check_asset_name``), its digest ``sha256:<64 hex>`` and its size a positive
number before the asset can be chosen. An asset that fails is never chosen, and is listed with
the reason when nothing else fits; no part of it reaches a path.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin

import attrs

from llmgw_shared.logs import get_logger
from llmgw_shared.names import BadName, check_asset_name, check_digest, shown

log = get_logger(__name__)

_LINUX_NAMES = ("linux", "ubuntu")
_ARCH_NAMES = {"x86_64": ("x64", "x86_64", "amd64"), "aarch64": ("arm64", "aarch64")}
_NAME = re.compile(
    r"(?P<prefix>llama-[^-]+|cudart-llama)-bin-(?P<rest>.+?)(?P<suffix>\.tar\.gz|\.tgz|\.zip)"
)
# GitHub allows 1000 assets per release; llama.cpp publishes about 40.
MAX_ASSETS = 1000
# GitHub's download URLs are about 120 characters; browsers and servers cap URLs near 2-8 KB.
MAX_URL = 2048


class ReleaseError(Exception):
    """The release index is unusable, or nothing in it fits this node."""


@attrs.frozen
class ReleaseAsset:
    name: str
    url: str
    size: int
    sha256: str  # hex, checked; "" when the release publishes no digest
    # Why this asset may not be used (a bad name, digest or size), in words for the operator.
    refused: str = ""


@attrs.frozen
class Platform:
    os: str  # "linux"
    arch: str  # "x86_64" | "aarch64"
    cuda: bool  # an NVIDIA driver is loaded


def parse_release(data: Any, base_url: str = "") -> list[ReleaseAsset]:
    """The assets of a release index; a relative ``browser_download_url`` is resolved against
    ``base_url`` (the index's own URL), so one signed index serves from any mirror of it."""
    if not isinstance(data, dict) or not isinstance(data.get("assets"), list):
        raise ReleaseError("release JSON has no 'assets' list")
    if len(data["assets"]) > MAX_ASSETS:
        raise ReleaseError(f"release JSON lists {len(data['assets'])} assets; more than {MAX_ASSETS} is not a "
                           "release")
    assets = []
    for item in data["assets"]:
        if not isinstance(item, dict):
            continue
        name, url, digest = item.get("name"), item.get("browser_download_url"), item.get("digest")
        size = item.get("size")
        if not (isinstance(name, str) and isinstance(url, str)):
            continue
        if base_url:
            url = urljoin(base_url, url)
        asset = _checked(name, url, size, digest)
        if asset.refused:
            log.warning("release asset refused: %s", asset.refused)
        assets.append(asset)
    return assets


def _checked(name: str, url: str, size: object, digest: object) -> ReleaseAsset:
    sha, problems = "", []
    try:
        check_asset_name(name)
    except BadName as exc:
        problems.append(str(exc))
    if digest is not None:
        try:
            sha = check_digest(digest)
        except BadName as exc:
            problems.append(str(exc))
    if len(url) > MAX_URL or not url.startswith(("http://", "https://")):
        # The URL is fetched and recorded in the install's provenance (and every hello): a
        # plain http(s) URL of sane length, or the asset is not used.
        problems.append(f"download URL {shown(url)} is not an http(s) URL of at most {MAX_URL} characters")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        problems.append(f"size {size!r} is not a positive number of bytes")
        size = 0
    return ReleaseAsset(name=name, url=url, size=size, sha256=sha, refused="; ".join(problems))


@attrs.frozen
class _Parsed:
    asset: ReleaseAsset
    cudart: bool
    os: str
    variant: str
    arch: str


def _parse_name(asset: ReleaseAsset) -> _Parsed | None:
    m = _NAME.fullmatch(asset.name)
    if not m or asset.refused:
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
        if a.refused:
            reasons.append(f"{shown(a.name)} ({a.refused})")
        elif p is None:
            reasons.append(f"{a.name} (not a llama.cpp build archive)")
        elif p.cudart:
            reasons.append(f"{a.name} (a CUDA runtime, not a build)")
        else:
            reasons.append(f"{a.name} ({_why_not(p, plat) or 'no reason'})")
    offered = "; ".join(reasons) if reasons else "the release has no assets"
    raise ReleaseError(f"no asset fits {plat.os}/{plat.arch}{' with CUDA' if plat.cuda else ''}: {offered}")
