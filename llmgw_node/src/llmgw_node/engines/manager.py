"""Engines on this node: install what control asks for, prove it runs, keep proving it.

An engine is reported only when it was installed here and seen to run (``installed``) or when
the node's config names it by path (``configured``). Nothing found by chance on PATH counts.

Layout under ``<data_dir>/engines``::

    <name>/<version>/            a proven install (renamed into place in one step)
    <name>/<version>/.llmgw-engine.json   what was installed and how it answered
    .staging/<name>-<version>-*  work in progress; deleted on failure and on start-up
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import httpx2
import trio

from llmgw_node.config import ConfiguredEngine
from llmgw_node.engines import proof
from llmgw_node.engines.release import Platform, ReleaseAsset, ReleaseError, choose_assets, parse_release
from llmgw_node.engines.unpack import UnsafeArchive, safe_unpack
from llmgw_node.fetch import FetchError, fetch, human_size
from llmgw_shared.jsonin import loads as json_loads
from llmgw_shared.logs import get_logger
from llmgw_shared.wire import LLAMA_CPP_RELEASES, EngineSpec, EngineState

log = get_logger("llmgw.node.engines")

MARKER = ".llmgw-engine.json"
# Archive engines this node knows how to install, and the server binary inside each.
ARCHIVE_ENGINES: dict[str, tuple[str, str]] = {
    "llama.cpp": ("llama-server", LLAMA_CPP_RELEASES),
}

Key = tuple[str, str]


class InstallError(Exception):
    """An install was refused or failed; the text is what the engine state says."""


@attrs.frozen
class Installed:
    binary: Path
    reported_version: str


class EngineManager:
    def __init__(
        self,
        data_dir: Path,
        client: httpx2.AsyncClient,
        platform: Platform,
        *,
        configured: list[ConfiguredEngine] | None = None,
        allow_os_packages: bool = False,
        known_packages: dict[str, dict[str, str]] | None = None,
        on_change: Callable[[EngineState], None] | None = None,
        version_timeout: float = 20.0,
    ) -> None:
        self.root = data_dir / "engines"
        self.client = client
        self.platform = platform
        self.configured = list(configured or [])
        self.allow_os_packages = allow_os_packages
        # Missing library -> OS package, per package manager (apt, dnf).
        self.known_packages = known_packages if known_packages is not None else proof.KNOWN_PACKAGES
        self.version_timeout = version_timeout
        self._on_change = on_change
        self._states: dict[Key, EngineState] = {}
        self._installed: dict[Key, Installed] = {}
        self._wanted: dict[Key, EngineSpec] = {}
        self._locks: dict[Key, trio.Lock] = {}

    # ------------------------------------------------------------------ state

    def states(self) -> list[EngineState]:
        return [self._states[k] for k in sorted(self._states)]

    def state(self, name: str, version: str) -> EngineState:
        return self._states.get((name, version), EngineState(name=name, version=version, status="absent"))

    def binary(self, name: str, version: str) -> Path | None:
        """The proven binary for ``(name, version)``; for a configured engine any version matches."""
        found = self._installed.get((name, version))
        if found is not None:
            return found.binary
        for key, inst in self._installed.items():
            if key[0] == name and self._states[key].status == "configured":
                return inst.binary
        return None

    def _set(self, state: EngineState) -> EngineState:
        key = (state.name, state.version)
        if self._states.get(key) != state:
            self._states[key] = state
            if state.status == "installing":
                log.debug("engine %s %s: %s", state.name, state.version, state.describe())
            else:
                log.info("engine %s %s: %s", state.name, state.version, state.describe())
            if self._on_change is not None:
                self._on_change(state)
        return state

    def _lock(self, key: Key) -> trio.Lock:
        return self._locks.setdefault(key, trio.Lock())

    # ------------------------------------------------------------------ start-up

    async def load(self, *, prove: bool = True) -> None:
        """Find installs from earlier runs and configured engines; prove each before reporting it.

        ``prove=False`` only reads what was recorded at install time (``engines list``).
        """
        shutil.rmtree(self.root / ".staging", ignore_errors=True)
        if self.root.is_dir():
            for name_dir in sorted(self.root.iterdir()):
                if name_dir.name.startswith(".") or not name_dir.is_dir():
                    continue
                for version_dir in sorted(name_dir.iterdir()):
                    marker = version_dir / MARKER
                    if version_dir.name.startswith(".") or not marker.is_file():
                        continue
                    try:
                        info = json.loads(marker.read_text())
                        binary = version_dir / info["binary"]
                    except (OSError, ValueError, KeyError, TypeError):
                        log.warning("ignoring unreadable install marker", extra={"path": str(marker)})
                        continue
                    key = (name_dir.name, version_dir.name)
                    line = str(info.get("reported_version", ""))
                    self._installed[key] = Installed(binary=binary, reported_version=line)
                    if prove:
                        await self.check(*key)
                    else:
                        self._set(EngineState(name=key[0], version=key[1], status="installed",
                                              reported_version=line, binary=str(binary)))
        for eng in self.configured:
            await self._prove_configured(eng)

    async def _prove_configured(self, eng: ConfiguredEngine) -> None:
        version = eng.version or "configured"
        binary = Path(eng.path)
        try:
            if not await trio.to_thread.run_sync(_is_executable, binary):
                raise proof.ProofError(f"{eng.path} is not an executable file")
            line = await proof.engine_version(binary, eng.version_args, time_limit=self.version_timeout)
        except proof.ProofError as exc:
            self._set(EngineState(name=eng.name, version=version, status="failed", detail=str(exc),
                                  binary=str(binary)))
            return
        version = eng.version or line
        self._installed[(eng.name, version)] = Installed(binary=binary, reported_version=line)
        self._set(EngineState(name=eng.name, version=version, status="configured", reported_version=line,
                              binary=str(binary)))

    # ------------------------------------------------------------------ converge

    def want(self, specs: list[EngineSpec]) -> list[EngineSpec]:
        """Record what control wants; return the specs that still need an install."""
        self._wanted = {(s.name, s.version): s for s in specs}
        todo = []
        for spec in specs:
            state = self.state(spec.name, spec.version)
            if state.status not in ("installed", "configured", "installing"):
                todo.append(spec)
            if spec.name not in ARCHIVE_ENGINES and state.status == "absent":
                configured = [e for e in self.configured if e.name == spec.name]
                if not configured:
                    self._set(EngineState(name=spec.name, version=spec.version, status="failed",
                                          detail=f"unknown engine {spec.name!r}: name it in the node's "
                                                 "config by path"))
        todo = [s for s in todo if s.name in ARCHIVE_ENGINES]
        for spec in todo:
            # Installing from this moment, so a start_shard right behind set_engines waits for it.
            self._progress(spec, "queued")
        return todo

    async def install(self, spec: EngineSpec) -> EngineState:
        """Install and prove ``spec``; the returned (and reported) state says how it went."""
        key = (spec.name, spec.version)
        async with self._lock(key):
            current = self.state(*key)
            if current.status in ("installed", "configured") and key in self._installed:
                return current
            try:
                binary, line = await self._install(spec)
            except (InstallError, FetchError, ReleaseError, UnsafeArchive, proof.ProofError) as exc:
                return self._set(EngineState(name=spec.name, version=spec.version, status="failed",
                                             detail=str(exc)))
            self._installed[key] = Installed(binary=binary, reported_version=line)
            return self._set(EngineState(name=spec.name, version=spec.version, status="installed",
                                         reported_version=line, binary=str(binary)))

    def _progress(self, spec: EngineSpec, what: str) -> None:
        self._set(EngineState(name=spec.name, version=spec.version, status="installing", detail=what))

    async def _install(self, spec: EngineSpec) -> tuple[Path, str]:
        if spec.name not in ARCHIVE_ENGINES:
            raise InstallError(f"unknown engine {spec.name!r}: only {', '.join(ARCHIVE_ENGINES)} install "
                               "from releases; name others in the node's config by path")
        binary_name, default_source = ARCHIVE_ENGINES[spec.name]
        source = (spec.release_api or default_source).replace("{version}", spec.version)
        self._progress(spec, f"fetching the release index for {spec.version}")
        assets = await self._release_assets(source)
        chosen = choose_assets(assets, self.platform)
        downloads = self.root / ".downloads"
        archives = []
        for asset in chosen:
            archives.append(await self._download(spec, asset, downloads))
        staging_root = self.root / ".staging"
        staging_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{spec.name}-{spec.version}-", dir=staging_root))
        try:
            for asset, archive in zip(chosen, archives, strict=True):
                self._progress(spec, f"unpacking {asset.name}")
                await trio.to_thread.run_sync(safe_unpack, archive, staging)
            binary = await trio.to_thread.run_sync(_find_and_gather, staging, binary_name)
            if binary is None:
                raise InstallError(f"{chosen[0].name} has no {binary_name}")
            line = await self._prove(spec, binary)
            (staging / MARKER).write_text(json.dumps({
                "name": spec.name, "version": spec.version, "source": source.split("?", 1)[0],
                "assets": [{"name": a.name, "sha256": a.sha256} for a in chosen],
                "binary": str(binary.relative_to(staging)), "reported_version": line,
                "installed_at": time.time(),
            }, indent=2))
            final = self.root / spec.name / spec.version
            final.parent.mkdir(parents=True, exist_ok=True)
            old = None
            if final.exists():
                # A broken earlier install: move it aside in one step, then delete it.
                old = Path(tempfile.mkdtemp(prefix="old-", dir=staging_root))
                os.replace(final, old / "x")
            os.replace(staging, final)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            for archive in archives:
                archive.unlink(missing_ok=True)
            return final / binary.relative_to(staging), line
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    async def _release_assets(self, source: str) -> list[ReleaseAsset]:
        shown = source.split("?", 1)[0]
        try:
            resp = await self.client.get(source, timeout=30.0, follow_redirects=True,
                                         headers={"Accept": "application/vnd.github+json"})
        except httpx2.HTTPError as exc:
            raise InstallError(f"release index {shown}: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise InstallError(f"release index {shown}: HTTP {resp.status_code}")
        try:
            data = json_loads(resp.content)
        except ValueError:
            raise InstallError(f"release index {shown}: not JSON") from None
        return parse_release(data)

    async def _download(self, spec: EngineSpec, asset: ReleaseAsset, downloads: Path) -> Path:
        if not asset.sha256:
            raise InstallError(f"{asset.name}: the release publishes no sha256 digest; refusing to install "
                               "an unverified archive")
        size_text = human_size(asset.size or None)
        last = [-1, 0.0]

        def progress(done: int, total: int | None) -> None:
            total = total or asset.size or None
            pct = int(done * 100 / total) if total else -1
            now = time.monotonic()
            # One report per percent and at most a few a second: progress, not a flood.
            if pct != last[0] and (now - last[1] >= 0.25 or pct == 100):
                last[0], last[1] = pct, now
                shown = f"{pct}%" if pct >= 0 else human_size(done)
                self._progress(spec, f"downloading {asset.name} ({size_text}, {shown})")

        self._progress(spec, f"downloading {asset.name} ({size_text}, 0%)")
        return await fetch(self.client, asset.url, downloads / f"{asset.sha256[:16]}-{asset.name}",
                           sha256=asset.sha256, size=asset.size or None, progress=progress, label=asset.name)

    async def _prove(self, spec: EngineSpec, binary: Path) -> str:
        self._progress(spec, "checking libraries (ldd)")
        missing = await proof.missing_libraries(binary)
        if missing:
            missing = await self._try_os_packages(spec, missing, binary)
        if missing:
            raise proof.ProofError("; ".join(f"missing library: {lib}" for lib in missing))
        self._progress(spec, f"running {binary.name} --version")
        return await proof.engine_version(binary, time_limit=self.version_timeout)

    async def _try_os_packages(self, spec: EngineSpec | None, missing: list[str], binary: Path) -> list[str]:
        manager = proof.package_manager()
        if not self.allow_os_packages or manager is None:
            return missing
        packages, _unknown = proof.packages_for(missing, manager, self.known_packages)
        if not packages:
            return missing
        if spec is not None:
            self._progress(spec, f"installing OS packages: {' '.join(packages)}")
        await proof.install_packages(manager, packages)
        return await proof.missing_libraries(binary)

    # ------------------------------------------------------------------ re-check

    async def check(self, name: str, version: str) -> EngineState:
        """Prove an installed engine again (ldd and --version); report failure in its own words."""
        key = (name, version)
        async with self._lock(key):
            inst = self._installed.get(key)
            if inst is None:
                return self.state(name, version)
            try:
                missing = await proof.missing_libraries(inst.binary) if inst.binary.exists() else []
                if not inst.binary.exists():
                    raise proof.ProofError(f"{inst.binary} is gone")
                if missing:
                    missing = await self._try_os_packages(None, missing, inst.binary)
                if missing:
                    raise proof.ProofError("; ".join(f"missing library: {lib}" for lib in missing))
                line = await proof.engine_version(inst.binary, time_limit=self.version_timeout)
            except proof.ProofError as exc:
                del self._installed[key]
                return self._set(EngineState(name=name, version=version, status="failed",
                                             detail=f"re-check: {exc}", binary=str(inst.binary)))
            return self._set(EngineState(name=name, version=version, status="installed",
                                         reported_version=line, binary=str(inst.binary)))

    async def check_all(self) -> None:
        """Re-check every archive install; reinstall those control still wants and that broke."""
        for key in sorted(self._installed):
            if self._states.get(key, EngineState(*key, status="absent")).status != "installed":
                continue
            state = await self.check(*key)
            if state.status == "failed" and key in self._wanted:
                log.warning("engine %s %s broke since it was installed; reinstalling", *key)
                await self.install(self._wanted[key])
        # Installs that failed earlier get another try each round: a mirror may be back, a
        # release may have been fixed. The re-check interval is the backoff.
        for key, spec in sorted(self._wanted.items()):
            if self.state(*key).status == "failed" and spec.name in ARCHIVE_ENGINES:
                await self.install(spec)
        for eng in self.configured:
            await self._prove_configured(eng)

    async def run_rechecks(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            await self.check_all()


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _find_and_gather(root: Path, name: str) -> Path | None:
    matches = sorted(p for p in root.rglob(name) if p.is_file() and not p.is_symlink())
    if not matches:
        return None
    # The shallowest match is the release's own binary, not something in a sub-folder.
    binary = min(matches, key=lambda p: len(p.parts))
    if binary.parent != root:
        # Releases put everything in one top folder; a CUDA runtime archive is flat. Gather the
        # loose files next to the binary so its $ORIGIN rpath finds the runtime libraries too.
        for item in list(root.iterdir()):
            if item.is_file() and not item.is_symlink():
                os.replace(item, binary.parent / item.name)
    return binary
