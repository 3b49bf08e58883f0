"""A GitHub-shaped release index: which asset of a release fits this node.

GitHub's ``/repos/<owner>/<repo>/releases/tags/<tag>`` JSON lists ``assets`` with ``name``,
``size``, ``browser_download_url`` and ``digest`` (``"sha256:<hex>"``). Any mirror serving the
same shape works, which is how air-gapped clusters and the tests do it.

llama.cpp names its builds ``llama-<tag>-bin-<os>[-<variant>]-<arch>.<tar.gz|zip>`` and the CUDA
runtime for a CUDA build ``cudart-llama[-<tag>]-bin-<os>-cuda-<ver>-<arch>.<tar.gz|zip>``: without
the tag on Windows and in the first Linux CUDA releases, with it in later ones (the names the
node relies on; ``backends`` lists the variants). Linux releases carry ``ubuntu-x64`` (CPU),
``ubuntu-vulkan-x64``, ``ubuntu-rocm-<ver>-x64`` and ``ubuntu-cuda-<ver>-x64``; some tags have no
``cudart-`` archive for a Linux CUDA build, and then the runtime comes from elsewhere
(``cuda_runtime``).

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

from llmgw_node.engines.backends import (
    Backend,
    backend_of,
    cuda_version,
    driver_major,
    min_driver,
    parse_backend,
    variant_version,
)
from llmgw_shared.facts import HostFacts
from llmgw_shared.logs import get_logger
from llmgw_shared.names import BadName, check_asset_name, check_digest, shown

log = get_logger(__name__)

_LINUX_NAMES = ("linux", "ubuntu")
_ARCH_NAMES = {"x86_64": ("x64", "x86_64", "amd64"), "aarch64": ("arm64", "aarch64")}
_NAME = re.compile(
    r"(?P<prefix>llama-[^-]+|cudart-llama(?:-[^-]+)?)-bin-(?P<rest>.+?)(?P<suffix>\.tar\.gz|\.tgz|\.zip)"
)
# NVIDIA's runtime wheels on PyPI, when a release index lists them (control adds them to the
# index it serves, pinned by sha256 like every asset): ``nvidia_cuda_runtime_cu12-12.8.90-py3-none-
# manylinux2014_x86_64.manylinux_2_17_x86_64.whl`` and ``nvidia_cublas_cu12-...`` for CUDA 12;
# ``nvidia_cuda_runtime-13.x-...`` and ``nvidia_cublas-13.x-...`` (no suffix) for CUDA 13. The
# version's major number is the CUDA major version. Their libraries are in nvidia/<lib>/lib/.
_WHEEL = re.compile(
    r"nvidia_(?P<lib>cuda_runtime|cublas)(?:_cu\d{1,3})?-(?P<version>\d{1,4}(?:\.\d{1,6}){0,4})"
    r"-py3-none-(?P<platform>[A-Za-z0-9_.]+)\.whl"
)
# What a CUDA build of llama.cpp loads: libcudart and libcublas (with libcublasLt, in the cublas wheel).
RUNTIME_WHEELS = ("cuda_runtime", "cublas")
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
    """What the node is, for choosing a build: its OS and CPU, and the GPUs it can reach."""

    os: str  # "linux"
    arch: str  # "x86_64" | "aarch64"
    cuda: bool = False  # an NVIDIA driver is loaded and lists GPUs
    # The driver's version ("550.54.15"); "" when unknown, which lets any CUDA build be tried.
    nvidia_driver: str = ""
    rocm: bool = False  # AMD GPUs behind the kernel's compute driver (/dev/kfd)
    vulkan: bool = False  # a Vulkan loader and a driver that lists a GPU
    # A backend pinned by the node's config (engine_backend): only that one is chosen.
    backend: Backend | None = None
    # GPUs seen that no backend can reach (HostFacts.gpus_unusable): "" when none.
    unusable: str = ""
    # The GPUs the node reported (HostFacts.gpus) and the backend their indices are for: what the
    # proof expects ``--list-devices`` to show.
    gpu_backend: str = ""
    gpus: tuple[int, ...] = ()

    @property
    def has_gpus(self) -> bool:
        return self.cuda or self.rocm or self.vulkan or bool(self.unusable)

    def gpu_words(self) -> str:
        kinds = [k for k, on in (("NVIDIA", self.cuda), ("AMD", self.rocm), ("Vulkan", self.vulkan)) if on]
        if not kinds and self.unusable:
            return f"a GPU it cannot reach ({self.unusable})"
        return " and ".join(kinds) + " GPUs" if kinds else "no GPUs"


def platform_for(facts: HostFacts, pin: str = "") -> Platform:
    """The Platform a node's facts describe, with its config's engine_backend pin."""
    return Platform(
        os="linux",
        arch=facts.arch or "x86_64",
        cuda=facts.nvidia_driver is not None,
        nvidia_driver=facts.nvidia_driver or "",
        rocm="rocm" in facts.gpu_backends,
        vulkan="vulkan" in facts.gpu_backends,
        backend=parse_backend(pin) if pin else None,
        unusable=facts.gpus_unusable,
        gpu_backend=facts.gpu_backend,
        gpus=tuple(g.index for g in facts.gpus),
    )


@attrs.frozen
class Choice:
    """The archives to install, the backend they carry, and why that is less than the node has."""

    assets: list[ReleaseAsset]
    backend: Backend
    # "" unless the node has GPUs and gets the CPU build: then the reason, for the degraded state.
    degraded: str = ""


def parse_release(data: Any, base_url: str = "") -> list[ReleaseAsset]:
    """The assets of a release index; a relative ``browser_download_url`` is resolved against
    ``base_url`` (the index's own URL), so one signed index serves from any mirror of it."""
    if not isinstance(data, dict) or not isinstance(data.get("assets"), list):
        raise ReleaseError("release JSON has no 'assets' list")
    if len(data["assets"]) > MAX_ASSETS:
        raise ReleaseError(f"release JSON lists {len(data['assets'])} assets; more than {MAX_ASSETS} is not a release")
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

    @property
    def backend(self) -> Backend | None:
        return backend_of(self.variant)


def _parse_name(asset: ReleaseAsset) -> _Parsed | None:
    m = _NAME.fullmatch(asset.name)
    if not m or asset.refused:
        return None
    parts = m["rest"].split("-")
    if len(parts) < 2:
        return None
    return _Parsed(
        asset=asset,
        cudart=m["prefix"].startswith("cudart-"),
        os=parts[0],
        variant="-".join(parts[1:-1]),
        arch=parts[-1],
    )


def _why_not(p: _Parsed, plat: Platform) -> str:
    """Why a build cannot run here at all (OS, CPU, a backend without its devices); "" if it can."""
    if plat.os == "linux" and p.os not in _LINUX_NAMES:
        return f"built for {p.os}"
    if p.arch not in _ARCH_NAMES.get(plat.arch, (plat.arch,)):
        return f"built for {p.arch}"
    backend = p.backend
    if backend is None:
        return f"a {p.variant} build, which this node does not use"
    if plat.backend is not None and backend != plat.backend:
        return f"a {backend} build, and this node is pinned to {plat.backend} (engine_backend)"
    if backend == "cuda" and not plat.cuda:
        return "a CUDA build and this node has no NVIDIA driver"
    if backend == "rocm" and not plat.rocm:
        return "a ROCm build and this node has no AMD GPU (/dev/kfd)"
    if backend == "vulkan" and not plat.vulkan:
        return "a Vulkan build and this node has no Vulkan driver that lists a GPU"
    return ""


def _driver_too_old(p: _Parsed, plat: Platform) -> str:
    """Why this node's NVIDIA driver cannot run this CUDA build; "" when it can (or is unknown)."""
    version = cuda_version(p.variant)
    have = driver_major(plat.nvidia_driver)
    if version is None or have is None:
        return ""
    need = min_driver(version)
    if need is None:
        return f"CUDA {version[0]}.{version[1]}: no known minimum driver"
    if have < need:
        return f"CUDA {version[0]}.{version[1]} needs NVIDIA driver {need} or later"
    return ""


def _prefer_tar(builds: list[_Parsed]) -> list[_Parsed]:
    # tar.gz keeps file modes; zip does not. Newest toolkit first, then tar.gz before zip.
    return sorted(
        builds,
        key=lambda p: (tuple(-v for v in variant_version(p.variant)), not p.asset.name.endswith((".tar.gz", ".tgz"))),
    )


def runtime_wheels(assets: list[ReleaseAsset], cuda_major: int, arch: str) -> list[ReleaseAsset]:
    """The newest wheel of each runtime library at ``cuda_major`` for ``arch``; [] unless all are there."""
    arch_words = _ARCH_NAMES.get(arch, (arch,))
    chosen: list[ReleaseAsset] = []
    for lib in RUNTIME_WHEELS:
        found = []
        for asset in assets:
            m = _WHEEL.fullmatch(asset.name)
            if asset.refused or not m or m["lib"] != lib or not any(a in m["platform"] for a in arch_words):
                continue
            version = tuple(int(x) for x in m["version"].split("."))
            if version[0] == cuda_major and "linux" in m["platform"]:
                found.append((version, asset))
        if not found:
            return []
        chosen.append(max(found, key=lambda f: f[0])[1])
    return chosen


def is_runtime_wheel(name: str) -> bool:
    return _WHEEL.fullmatch(name) is not None


def backend_of_assets(names: list[str]) -> str:
    """The backend an install's archives carry, read from their names ("" when none is a build)."""
    for name in names:
        m = _NAME.fullmatch(name)
        if m and not m["prefix"].startswith("cudart-"):
            parts = m["rest"].split("-")
            backend = backend_of("-".join(parts[1:-1])) if len(parts) >= 2 else None
            if backend is not None:
                return backend
    return ""


def choose_assets(assets: list[ReleaseAsset], plat: Platform) -> list[ReleaseAsset]:
    """The archives to install for ``plat`` (see ``choose_build``)."""
    return choose_build(assets, plat).assets


def choose_build(assets: list[ReleaseAsset], plat: Platform) -> Choice:
    """The build for the devices this node has, plus the CUDA runtime archive when there is one.

    In order: NVIDIA GPUs get the newest CUDA build their driver supports; AMD GPUs a ROCm build;
    any GPU a Vulkan driver lists a Vulkan build; the CPU build last. A node with NVIDIA GPUs whose
    driver is too old for every CUDA build the release has is refused, naming the driver it needs
    (pin ``engine_backend`` to use another backend there). A node with GPUs that gets the CPU
    build is ``degraded``, with the reason. When nothing fits, the error lists each asset and why.
    """
    parsed = [p for p in (_parse_name(a) for a in assets) if p is not None]
    fitting = [p for p in parsed if not p.cudart and not _why_not(p, plat)]
    by_devices: list[tuple[Backend, bool]] = [
        ("cuda", plat.cuda),
        ("rocm", plat.rocm),
        ("vulkan", plat.vulkan),
        ("cpu", True),
    ]
    order: list[Backend] = [plat.backend] if plat.backend is not None else [b for b, on in by_devices if on]
    for backend in order:
        builds = _prefer_tar([p for p in fitting if p.backend == backend])
        if backend == "cuda" and builds:
            usable = [p for p in builds if not _driver_too_old(p, plat)]
            if not usable:
                raise ReleaseError(_driver_refusal(builds, plat))
            build = usable[0]
            runtime = [r for r in parsed if r.cudart and r.variant == build.variant and not _why_not(r, plat)]
            if runtime:
                return Choice([build.asset, _prefer_tar(runtime)[0].asset], "cuda")
            # No cudart archive (the first Linux CUDA tags had none): NVIDIA's runtime wheels, when
            # the index lists them, at the build's CUDA major version.
            version = cuda_version(build.variant)
            wheels = runtime_wheels(assets, version[0], plat.arch) if version else []
            return Choice([build.asset, *wheels], "cuda")
        if builds:
            degraded = ""
            if backend == "cpu" and plat.has_gpus:
                degraded = (
                    f"this node has {plat.gpu_words()} and runs the CPU build: pinned to cpu by engine_backend"
                    if plat.backend == "cpu"
                    else f"this node has {plat.gpu_words()} but the release has no build for them that fits "
                    f"{plat.os}/{plat.arch}: running on the CPU"
                    if not (plat.unusable and not plat.cuda and not plat.rocm and not plat.vulkan)
                    else f"this node has {plat.gpu_words()}: running on the CPU"
                )
            return Choice([builds[0].asset], backend, degraded)
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
    pinned = f" pinned to {plat.backend}" if plat.backend is not None else ""
    raise ReleaseError(f"no asset fits {plat.os}/{plat.arch}{' with CUDA' if plat.cuda else ''}{pinned}: {offered}")


def _driver_refusal(builds: list[_Parsed], plat: Platform) -> str:
    needs = sorted({n for p in builds if (v := cuda_version(p.variant)) and (n := min_driver(v))})
    each = "; ".join(f"{p.asset.name}: {_driver_too_old(p, plat)}" for p in builds)
    least = f"NVIDIA driver {needs[0]} or later is needed" if needs else "no CUDA build has a known minimum driver"
    return (
        f"NVIDIA driver {plat.nvidia_driver} is too old for every CUDA build of this release ({each}): "
        f'{least}. Update the driver, or set engine_backend ("vulkan" or "cpu") in the node\'s config '
        "to run another build on this node"
    )
