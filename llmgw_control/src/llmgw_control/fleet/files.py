"""Control as a release mirror and model file server for air-gapped clusters.

Nodes install engines from a GitHub-shaped release JSON and fetch weights by URL. When control
has the archives and model files in a local directory, it serves both over the agent listener,
so a cluster with no internet works -- and so do the tests and the demo, without GitHub.

Layout: ``<dir>/engines/llama-<tag>-bin-<os>-<arch>.tar.gz`` and ``<dir>/models/<file>``.

Every path is resolved before it is served, and a file whose real path is not inside its kind's
directory (``engines/`` or ``models/``, each as it resolves) is not served: a symlink in
``models/`` pointing at ``/etc/shadow`` or at control's own secrets is a 404, not a download.
Links inside a directory to files in it stay allowed, and so does making ``models`` itself a
link to where the weights live (``models -> /data/models``): the operator chose that directory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs

from llmgw_shared.hashing import file_sha256
from llmgw_shared.logs import get_logger
from llmgw_shared.names import BadName, check_engine_name, check_version
from llmgw_shared.threads import DISK, FILES

from ..catalog import EngineConfig
from .runtime_wheels import PINS_FILE, read_pins

log = get_logger(__name__)

# What a generated release index lists from <files>/engines: llama.cpp builds of the version, CUDA
# runtime archives (``cudart-llama-bin-...`` untagged, or ``cudart-llama-<tag>-bin-...``), and
# NVIDIA's CUDA runtime wheels (``nvidia_cuda_runtime[_cu12]-<ver>-...whl``, ``nvidia_cublas...``),
# which a node unpacks beside a CUDA build when the release has no cudart archive: put there by
# ``llmgw-control engines runtime`` (pinned in engines/cuda-runtime.lock, fleet/runtime_wheels.py)
# or by the operator, listed with the sha256 control computes, served like every engine file.
_ARCHIVE = re.compile(
    r"^(llama-(?P<tag>[^-]+)-bin-.+|cudart-llama-(?:(?P<rtag>[^-]+)-)?bin-.+)\.(tar\.gz|tgz|zip)$"
    r"|^nvidia_(?:cuda_runtime|cublas)(?:_cu\d+)?-[0-9.]+-py3-none-[A-Za-z0-9_.]+\.whl$"
)


@attrs.frozen
class _Digest:
    size: int
    mtime_ns: int
    sha256: str


class FileServer:
    def __init__(self, root: Path, public_url: str) -> None:
        self.root = root
        self.public_url = public_url.rstrip("/")
        self._digests: dict[Path, _Digest] = {}

    def path(self, kind: str, name: str) -> Path | None:
        """The real path of the file for a URL path, or None; never anything outside ``<root>/<kind>``."""
        if kind not in ("engines", "models"):
            return None
        return contained_file(self.root / kind, name)

    async def sha256(self, path: Path) -> str:
        stat = await DISK.run(path.stat, abandon=True)
        cached = self._digests.get(path)
        if cached and cached.size == stat.st_size and cached.mtime_ns == stat.st_mtime_ns:
            return cached.sha256
        digest = await FILES.run(file_sha256, path, abandon=True)
        self._digests[path] = _Digest(stat.st_size, stat.st_mtime_ns, digest)
        return digest

    def has_release(self, version: str) -> bool:
        return any(_tag(a) == version for a in self._archives(version))

    def _archives(self, version: str) -> list[Path]:
        directory = self.root / "engines"
        if not directory.is_dir():
            return []
        found = []
        for entry in sorted(directory.iterdir()):
            match = _ARCHIVE.fullmatch(entry.name)
            # Only what path() would serve: a release must not list a file that is then refused.
            if (
                match
                and match["tag"] in (None, version)
                and match["rtag"] in (None, version)
                and contained_file(directory, entry.name) is not None
            ):
                found.append(entry)
        return found

    async def release(self, version: str) -> dict[str, Any] | None:
        archives = self._archives(version)
        if not any(_tag(a) == version for a in archives):
            return None
        pins = await DISK.run(self._pins, abandon=True)
        assets = []
        for archive in archives:
            digest = await self.sha256(archive)
            pinned = pins.get(archive.name)
            if pinned is not None and pinned != digest:
                # Replaced or damaged since it was pinned: nodes must not be offered other bytes.
                log.warning(
                    "not listing %s in the %s release: its sha256 %s is not the %s pinned in %s",
                    archive.name,
                    version,
                    digest,
                    pinned,
                    PINS_FILE,
                )
                continue
            assets.append(
                {
                    "name": archive.name,
                    "size": archive.stat().st_size,
                    "browser_download_url": f"{self.public_url}/files/engines/{archive.name}",
                    "digest": f"sha256:{digest}",
                }
            )
        return {"tag_name": version, "name": version, "assets": assets}

    def _pins(self) -> dict[str, str]:
        """The runtime wheels' pins (file -> sha256); none when the pins file is missing or unreadable."""
        try:
            return read_pins(self.root / "engines")
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s: %s", self.root / "engines" / PINS_FILE, exc)
            return {}

    def static_release(self, name: str, version: str) -> tuple[Path, Path | None] | None:
        """An index the operator wrote (and signed) for ``name`` ``version``: served as it is.

        ``<dir>/engines/<name>-<version>.json`` and its minisign signature ``.json.minisig``
        beside it. A signature covers exact bytes, so a signed index is a file, never generated:
        nodes with ``release_signing_keys`` install only from these (see release_index_signing in
        docs/operator-guide.md). None when there is none (then ``release`` generates one).
        """
        try:
            check_engine_name(name)
            check_version(version)
        except BadName:
            return None
        # Resolved as every served file is: a link in engines/ must not lead out of it.
        engines = self.root / "engines"
        index = contained_file(engines, f"{name}-{version}.json")
        if index is None:
            return None
        return index, contained_file(engines, f"{name}-{version}.json.minisig")

    def release_api(self, engine: EngineConfig) -> str:
        """Where nodes should look for ``engine``: its configured source, else this server if it has it."""
        if engine.release_api:
            return engine.release_api
        if engine.name == "llama.cpp" and (
            self.has_release(engine.version) or self.static_release(engine.name, engine.version)
        ):
            return f"{self.public_url}/releases/llama.cpp/{{version}}"
        return ""


def contained_file(directory: Path, name: str) -> Path | None:
    """The real path of the regular file ``name`` in ``directory`` when it resolves inside it, else None.

    ``name`` is one URL path segment: no separators, no leading dot (no ``..``, no hidden files).
    """
    if not name or "/" in name or "\\" in name or "\x00" in name or name.startswith("."):
        return None
    try:
        served = directory.resolve(strict=True)
        real = (directory / name).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, a loop of links, a name too long
        return None
    if real.parent != served and served not in real.parents:
        return None
    return real if real.is_file() else None


def _tag(archive: Path) -> str | None:
    match = _ARCHIVE.fullmatch(archive.name)
    return match["tag"] if match else None
