"""Engines on this node: install what control asks for, prove it runs, keep proving it.

An engine is reported only when it was installed here and seen to run (``installed``) or when
the node's config names it by path (``configured``). Nothing found by chance on PATH counts.

Layout under ``<data_dir>/engines``::

    <name>/<version>/            a proven install (renamed into place in one step)
    <name>/<version>/.llmgw-engine.json   what was installed, where it came from, how it answered
    <name>/<version>/.llmgw-index.json    the release index it was chosen from (+ .minisig when signed)
    <name>/<version>/.llmgw-archives/     the archives, with ``keep_engine_archives``
    .staging/<name>-<version>-*  work in progress; deleted on failure and on start-up
    .downloads/<sha256[:16]>-<asset>  archives being fetched; deleted once unpacked

Every name in those paths came from the network and was checked first (``llmgw_shared.names``):
the engine name, the version, the asset name and its digest. An install that fails for any
reason is reported ``failed`` with the reason and never raises: a hostile release cannot stop
the daemon. A failed install is retried with backoff, however often control asks again.

About 1,030 lines: one install is one sequence (index, download, verify, unpack, prove, rename into
place) whose steps share the manager's state (the retry record, the reported engines, the
layout above); the archive checks themselves live in ``unpack``.
"""

from __future__ import annotations

import functools
import hashlib
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

from llmgw_node.config import ConfiguredEngine, NodeConfig
from llmgw_node.disk import NotEnoughDisk, check_room
from llmgw_node.engines import proof
from llmgw_node.engines.backends import DEVICE_PREFIX, GPU_BACKENDS, VISIBLE_DEVICES_ENV, Backend, parse_backend
from llmgw_node.engines.release import (
    Choice,
    Platform,
    ReleaseAsset,
    ReleaseError,
    backend_of_assets,
    choose_build,
    is_runtime_wheel,
    parse_release,
)
from llmgw_node.engines.signature import (
    MAX_SIGNATURE_BYTES,
    PublicKey,
    SignatureError,
    Verified,
    signature_url,
    verify,
)
from llmgw_node.engines.unpack import UnpackLimits, UnsafeArchive, safe_unpack
from llmgw_node.fetch import URL_ERRORS, FetchError, fetch, human_size
from llmgw_shared import tracing
from llmgw_shared.engine_lifecycle import ENGINE_LIFECYCLE, SERVES, EngineInstall, on_wire
from llmgw_shared.jsonin import loads as json_loads
from llmgw_shared.logs import get_logger
from llmgw_shared.names import BadName, check_asset_name, check_engine_name, check_version
from llmgw_shared.names import shown as shown_name
from llmgw_shared.threads import DISK, FILES, INSTALL
from llmgw_shared.wire import (
    LLAMA_CPP_RELEASES,
    AssetProvenance,
    EngineProvenance,
    EngineSpec,
    EngineState,
    WireError,
    check_from_node,
    converter,
)

log = get_logger(__name__)

MARKER = ".llmgw-engine.json"
# Beside the marker: the index bytes the install was chosen from, its signature, the archives.
INDEX_COPY = ".llmgw-index.json"
SIGNATURE_COPY = ".llmgw-index.json.minisig"
ARCHIVES_DIR = ".llmgw-archives"
# Where NVIDIA runtime wheels unpack in staging before their libraries join the engine.
RUNTIME_DIR = ".llmgw-runtime"
# Archive engines this node knows how to install, and the server binary inside each.
ARCHIVE_ENGINES: dict[str, tuple[str, str]] = {
    "llama.cpp": ("llama-server", LLAMA_CPP_RELEASES),
}

Key = tuple[str, str]
# GitHub's release JSON for llama.cpp (about 40 assets) is about 60 KB; its 1000-asset maximum
# about 2 MB. Past this the "index" is not one, and it would sit in memory whole.
MAX_RELEASE_JSON = 4 << 20
# The whole index request, not one read: a server that trickles a byte every 29 s passes any
# per-read timeout forever.
RELEASE_INDEX_TIMEOUT = 60.0
# The errors an install reports in its own words; anything else is a bug, reported as one.
REFUSALS = (BadName, FetchError, NotEnoughDisk, ReleaseError, UnsafeArchive, proof.ProofError, SignatureError)


class InstallError(Exception):
    """An install was refused or failed; the text is what the engine state says."""


@attrs.frozen
class Installed:
    binary: Path
    reported_version: str
    provenance: EngineProvenance | None = None

    @property
    def backend(self) -> str:
        """The GPU backend the build carries: recorded at install, or read from its archive names."""
        if self.provenance is None:
            return ""
        return self.provenance.backend or backend_of_assets([a.name for a in self.provenance.assets])


@attrs.frozen
class _Index:
    """A release index as fetched: its bytes, its signature (when one was required), its assets."""

    source: str
    body: bytes
    signature: bytes
    verified: Verified | None
    assets: list[ReleaseAsset]


@attrs.frozen
class RetryPolicy:
    """Backoff between attempts at an install that failed: ``min(max_s, min_s * 2**(n-1))``."""

    min_s: float = 30.0
    max_s: float = 600.0

    def delay(self, failures: int) -> float:
        return float(min(self.max_s, self.min_s * 2.0 ** max(0, failures - 1)))


@attrs.define
class _Failure:
    spec: EngineSpec
    count: int
    retry_at: float


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
        limits: UnpackLimits | None = None,
        retry: RetryPolicy | None = None,
        signing_keys: list[PublicKey] | None = None,
        keep_archives: bool = False,
    ) -> None:
        self.root = data_dir / "engines"
        self.limits = limits or UnpackLimits()
        self.retry = retry or RetryPolicy()
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
        self._failures: dict[Key, _Failure] = {}
        # Indexes must be signed by one of these (release_signing_keys); none: taken as fetched.
        self.signing_keys = list(signing_keys or [])
        self.keep_archives = keep_archives
        # The epoch (fencing token) of the control leader whose set_engines asked for the
        # engines now wanted: recorded in each install's provenance as who asked. 0: by hand.
        self.control_epoch = 0

    @classmethod
    def from_config(
        cls,
        config: NodeConfig,
        client: httpx2.AsyncClient,
        platform: Platform,
        on_change: Callable[[EngineState], None] | None = None,
    ) -> EngineManager:
        """The manager ``config`` describes: what the daemon and ``engines install`` both use."""
        return cls(
            config.data_path,
            client,
            platform,
            configured=config.engines,
            allow_os_packages=config.allow_os_packages,
            on_change=on_change,
            limits=UnpackLimits(max_bytes=config.unpack_max_bytes, max_entries=config.unpack_max_entries),
            retry=RetryPolicy(min_s=config.install_retry_min_s, max_s=config.install_retry_max_s),
            signing_keys=config.signing_keys,
            keep_archives=config.keep_engine_archives,
        )

    # ------------------------------------------------------------------ state

    def states(self) -> list[EngineState]:
        return [self._states[k] for k in sorted(self._states)]

    def state(self, name: str, version: str) -> EngineState:
        return self._states.get(
            (name, version), EngineState(name=name, version=version, status=on_wire(EngineInstall.ABSENT))
        )

    def status(self, name: str, version: str) -> EngineInstall:
        return EngineInstall(self.state(name, version).status)

    def binary(self, name: str, version: str) -> Path | None:
        """The proven binary for ``(name, version)``; for a configured engine any version matches."""
        found = self._installed.get((name, version))
        if found is not None:
            return found.binary
        for key, inst in self._installed.items():
            if key[0] == name and EngineInstall(self._states[key].status) is EngineInstall.CONFIGURED:
                return inst.binary
        return None

    def engine_backend(self, name: str, version: str) -> str:
        """The GPU backend of the install serving ``(name, version)``; "" when unknown (configured)."""
        found = self._installed.get((name, version))
        return found.backend if found is not None else ""

    def _set(
        self,
        key: Key,
        status: EngineInstall,
        detail: str = "",
        *,
        reported_version: str = "",
        binary: str = "",
        provenance: EngineProvenance | None = None,
    ) -> EngineState:
        """Record and report a change, if ``llmgw_shared.engine_lifecycle``'s table allows it; the
        engine's state after.

        One the table forbids is a bug here: logged as an error and refused (the engine keeps its
        status, nothing is sent), since the daemon must not die for it.
        """
        state = EngineState(
            name=key[0],
            version=key[1],
            status=on_wire(status),
            detail=detail,
            reported_version=reported_version,
            binary=binary,
            provenance=provenance,
        )
        before = self.state(*key)
        if before == state:
            return state
        current = EngineInstall(before.status)
        if not ENGINE_LIFECYCLE.allowed(current, status):
            log.error(
                "engine %s %s: %s -> %s is not in the engine install lifecycle's table (a bug in the node): "
                "not recorded, not reported (%s)",
                key[0],
                key[1],
                current,
                status,
                detail,
            )
            return before
        self._states[key] = state
        if status == EngineInstall.INSTALLING:
            log.debug("engine %s %s: %s", state.name, state.version, state.describe())
        else:
            log.info("engine %s %s: %s", state.name, state.version, state.describe())
        if self._on_change is not None:
            self._on_change(state)
        return state

    def _lock(self, key: Key) -> trio.Lock:
        return self._locks.setdefault(key, trio.Lock())

    # ------------------------------------------------------------------ start-up

    async def load(self, *, prove: bool = True, verify_archives: bool = False) -> None:
        """Find installs from earlier runs and configured engines; prove each before reporting it.

        ``prove=False`` only reads what was recorded at install time (``engines list``);
        ``verify_archives`` also hashes kept archives again (``engines check``).
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
                    self._installed[key] = Installed(
                        binary=binary, reported_version=line, provenance=_recorded_provenance(info, marker)
                    )
                    if prove:
                        await self.check(*key, verify_archives=verify_archives)
                    else:
                        self._set_installed(key, line)
        for eng in self.configured:
            await self._prove_configured(eng)

    async def _prove_configured(self, eng: ConfiguredEngine) -> None:
        version = eng.version or "configured"
        binary = Path(eng.path)
        try:
            if not await DISK.run(_is_executable, binary, abandon=True):
                raise proof.ProofError(f"{eng.path} is not an executable file")
            line = await proof.engine_version(binary, eng.version_args, time_limit=self.version_timeout)
        except proof.ProofError as exc:
            self._set((eng.name, version), EngineInstall.FAILED, str(exc), binary=str(binary))
            return
        version = eng.version or line
        self._installed[(eng.name, version)] = Installed(binary=binary, reported_version=line)
        self._set((eng.name, version), EngineInstall.CONFIGURED, reported_version=line, binary=str(binary))

    # ------------------------------------------------------------------ converge

    def want(self, specs: list[EngineSpec], *, control_epoch: int = 0) -> list[EngineSpec]:
        """Record what control wants; return the specs that still need an install.

        ``control_epoch`` is the fencing token of the command that asked: each install records
        it as who asked for the engine.
        """
        # A name or version that may not name a folder never becomes a path, a state or a report
        # (control could not decode a report naming it): the command's ack says why (``bad_names``).
        specs = [s for s in specs if not bad_names(s)]
        self._wanted = {(s.name, s.version): s for s in specs}
        self.control_epoch = control_epoch
        todo = []
        for spec in specs:
            status = self.status(spec.name, spec.version)
            if status == EngineInstall.FAILED and self._backing_off(spec):
                continue
            if status not in (*SERVES, EngineInstall.INSTALLING):
                todo.append(spec)
            if spec.name not in ARCHIVE_ENGINES and status == EngineInstall.ABSENT:
                configured = [e for e in self.configured if e.name == spec.name]
                if not configured:
                    # Not a failure: this node simply has no such engine, and placement skips it.
                    self._set(
                        (spec.name, spec.version),
                        EngineInstall.UNCONFIGURED,
                        f"{spec.name} is not configured here: name it by path in "
                        "the node's [[engines]] to serve it on this node",
                    )
        todo = [s for s in todo if s.name in ARCHIVE_ENGINES]
        for spec in todo:
            # Installing from this moment, so a StartReplica right behind SetEngines waits for it.
            self._progress(spec, "queued")
        return todo

    async def install(self, spec: EngineSpec) -> EngineState:
        """Install and prove ``spec``; the returned (and reported) state says how it went.

        Never raises for anything the release, the archive, the network or the disk do: each
        is a ``failed`` state with the reason, and the next attempt waits out a backoff.
        Cancellation goes through (staging is deleted on the way out).
        """
        key = (spec.name, spec.version)
        async with self._lock(key):
            current = self.state(*key)
            if current.status in SERVES and key in self._installed:
                return current
            try:
                # A span per install (llmgw_shared/tracing.py); a failure is its status.
                with tracing.span(
                    "llmgw.engine_install", {"llmgw.engine": spec.name, "llmgw.engine_version": spec.version}
                ):
                    binary, line, provenance = await self._install(spec)
            except (InstallError, *REFUSALS) as exc:
                return self._failed(spec, str(exc))
            except OSError as exc:
                # The data disk itself: unwritable, gone read-only, out of inodes.
                return self._failed(spec, f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}")
            except Exception as exc:
                # A bug, not an input: reported as one, and the daemon keeps serving.
                log.error("engine %s %s: install crashed", spec.name, spec.version, exc_info=True)
                return self._failed(spec, f"unexpected error while installing: {type(exc).__name__}: {exc}")
            self._failures.pop(key, None)
            self._installed[key] = Installed(binary=binary, reported_version=line, provenance=provenance)
            return self._set_installed(key, line)

    def _set_installed(self, key: Key, line: str) -> EngineState:
        inst = self._installed[key]
        return self._set(
            key, EngineInstall.INSTALLED, reported_version=line, binary=str(inst.binary), provenance=inst.provenance
        )

    def _failed(self, spec: EngineSpec, detail: str) -> EngineState:
        key = (spec.name, spec.version)
        earlier = self._failures.get(key)
        count = earlier.count + 1 if earlier is not None and earlier.spec == spec else 1
        delay = self.retry.delay(count)
        self._failures[key] = _Failure(spec=spec, count=count, retry_at=trio.current_time() + delay)
        log.info("engine %s %s: attempt %d failed; the next waits %g s", spec.name, spec.version, count, delay)
        return self._set((spec.name, spec.version), EngineInstall.FAILED, detail)

    def _backing_off(self, spec: EngineSpec) -> bool:
        """A failed install of this same spec whose backoff has not passed yet."""
        failure = self._failures.get((spec.name, spec.version))
        return failure is not None and failure.spec == spec and trio.current_time() < failure.retry_at

    def _progress(self, spec: EngineSpec, what: str) -> None:
        self._set((spec.name, spec.version), EngineInstall.INSTALLING, what)

    async def _install(self, spec: EngineSpec) -> tuple[Path, str, EngineProvenance]:
        """One install's steps in order: names, index, download, unpack, prove, record, rename into place."""
        if spec.name not in ARCHIVE_ENGINES:
            raise InstallError(
                f"unknown engine {spec.name!r}: only {', '.join(ARCHIVE_ENGINES)} install "
                "from releases; name others in the node's config by path"
            )
        if problem := bad_names(spec):
            raise InstallError(problem)
        epoch = self.control_epoch
        binary_name, default_source = ARCHIVE_ENGINES[spec.name]
        source = (spec.release_api or default_source).replace("{version}", spec.version)
        self._progress(spec, f"fetching the release index for {spec.version}")
        index = await self._release_index(source, spec.version)
        choice = choose_build(index.assets, self.platform)
        if choice.degraded:
            log.warning("engine %s %s: %s", spec.name, spec.version, choice.degraded)
        downloads = self.root / ".downloads"
        archives = []
        for asset in choice.assets:
            archives.append(await self._download(spec, asset, downloads))
        staging_root = self.root / ".staging"
        staging_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{spec.name}-{spec.version}-", dir=staging_root))
        try:
            binary = await self._unpack(spec, choice.assets, archives, staging, binary_name)
            line = await self._prove(spec, binary, choice.backend)
            provenance = self._record(spec, staging, index, choice, archives, binary, line, epoch)
            final = self.root / spec.name / spec.version
            _rename_into_place(staging, final, staging_root)
            for archive in archives:
                archive.unlink(missing_ok=True)
            return final / binary.relative_to(staging), line, provenance
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    async def _unpack(
        self, spec: EngineSpec, chosen: list[ReleaseAsset], archives: list[Path], staging: Path, binary_name: str
    ) -> Path:
        """Every verified archive unpacked into ``staging``; the engine's binary, its libraries gathered beside it."""
        wheels = staging / RUNTIME_DIR
        for i, (asset, archive) in enumerate(zip(chosen, archives, strict=True)):
            self._progress(spec, f"unpacking {asset.name}")
            # A runtime wheel unpacks apart (its libraries are gathered beside the binary below).
            into = wheels / str(i) if is_runtime_wheel(asset.name) else staging
            into.mkdir(parents=True, exist_ok=True)
            try:
                await INSTALL.run(functools.partial(safe_unpack, archive, into, self.limits, shown_as=asset.name))
            except UnsafeArchive:
                # Verified against its digest and refused: the same bytes would be refused
                # again, so they do not stay on the disk (up to unpack_max_bytes each).
                for path in archives:
                    path.unlink(missing_ok=True)
                raise
        binary = await INSTALL.run(_find_and_gather, staging, binary_name)
        if binary is None:
            raise InstallError(f"{chosen[0].name} has no {binary_name}")
        if wheels.exists():
            await INSTALL.run(_gather_wheel_libraries, wheels, binary.parent)
        return binary

    def _record(
        self,
        spec: EngineSpec,
        staging: Path,
        index: _Index,
        choice: Choice,
        archives: list[Path],
        binary: Path,
        line: str,
        epoch: int,
    ) -> EngineProvenance:
        """What the proven install came from, written into ``staging`` beside it (and the archives, when kept)."""
        chosen = choice.assets
        # What the install came from is kept with it: the index as fetched (which lists every
        # archive's digest) and its signature, so `engines check` can verify both again.
        _write_new(staging, INDEX_COPY, index.body)
        if index.verified is not None:
            _write_new(staging, SIGNATURE_COPY, index.signature)
        if self.keep_archives:
            kept = staging / ARCHIVES_DIR
            try:
                kept.mkdir()
            except FileExistsError:
                raise InstallError(f"the archive has its own {ARCHIVES_DIR}; refusing it") from None
            for asset, archive in zip(chosen, archives, strict=True):
                os.replace(archive, kept / asset.name)
        provenance = EngineProvenance(
            source=index.source,
            index_sha256=hashlib.sha256(index.body).hexdigest(),
            assets=[AssetProvenance(a.name, a.url, a.sha256, a.size) for a in chosen],
            installed_at=time.time(),
            signed_by=index.verified.key_id if index.verified else "",
            control_epoch=epoch,
            archives_kept=self.keep_archives,
            backend=choice.backend,
            runtime=_runtime_words(chosen),
        )
        _write_marker(
            staging,
            {
                "name": spec.name,
                "version": spec.version,
                "source": index.source,
                "assets": [{"name": a.name, "sha256": a.sha256} for a in chosen],
                "binary": str(binary.relative_to(staging)),
                "reported_version": line,
                "installed_at": provenance.installed_at,
                "provenance": converter.unstructure(provenance),
            },
        )
        return provenance

    async def _release_index(self, source: str, version: str) -> _Index:
        """Fetch the index; with ``release_signing_keys``, its signature too, verified before parsing.

        A signed index must also name the tag that was asked for (``tag_name``): a signature
        says the operator published these bytes, not for which version, and an older signed
        index served under a newer version's URL would otherwise install the older build.
        """
        shown = source.split("?", 1)[0]
        body = await self._fetch_small(
            source, f"release index {shown}", MAX_RELEASE_JSON, accept="application/vnd.github+json"
        )
        verified, signature = None, b""
        if self.signing_keys:
            sig_url = signature_url(source)
            try:
                signature = await self._fetch_small(
                    sig_url,
                    f"signature {sig_url.split('?', 1)[0]}",
                    MAX_SIGNATURE_BYTES,
                    missing_ok=True,
                    too_large="not a minisign signature",
                )
            except InstallError as exc:
                raise InstallError(
                    f"release index {shown} is not signed: {exc}; release_signing_keys is set, "
                    "so nothing unsigned is installed"
                ) from None
            if not signature:
                raise InstallError(
                    f"release index {shown} is not signed (no {sig_url.split('?', 1)[0]}); "
                    "release_signing_keys is set, so nothing unsigned is installed"
                )
            try:
                verified = verify(body, signature, self.signing_keys)
            except SignatureError as exc:
                raise InstallError(f"release index {shown}: {exc}; not installing from it") from None
        try:
            data = json_loads(bytes(body))
        except ValueError:
            raise InstallError(f"release index {shown}: not JSON") from None
        if verified is not None:
            tag = data.get("tag_name") if isinstance(data, dict) else None
            if tag != version:
                raise InstallError(
                    f"release index {shown} is signed for tag {shown_name(tag)}, not {version}; not installing from it"
                )
        return _Index(
            source=shown,
            body=bytes(body),
            signature=signature,
            verified=verified,
            assets=parse_release(data, base_url=source),
        )

    async def _fetch_small(
        self,
        url: str,
        what: str,
        limit: int,
        *,
        accept: str = "*/*",
        missing_ok: bool = False,
        too_large: str = "not a release index",
    ) -> bytes:
        """A whole small document (an index, a signature) within ``limit`` bytes and 60 s.

        ``missing_ok``: a 404 answers ``b""`` instead of an error.
        """
        body = bytearray()
        try:
            with trio.fail_after(RELEASE_INDEX_TIMEOUT):
                async with self.client.stream(
                    "GET", url, timeout=30.0, follow_redirects=True, headers={"Accept": accept}
                ) as resp:
                    if missing_ok and resp.status_code == 404:
                        return b""
                    if resp.status_code != 200:
                        raise InstallError(f"{what}: HTTP {resp.status_code}")
                    async for chunk in resp.aiter_bytes():
                        body += chunk
                        if len(body) > limit:
                            raise InstallError(f"{what}: larger than {human_size(limit)}; {too_large}")
        except trio.TooSlowError:
            raise InstallError(f"{what}: not received within {RELEASE_INDEX_TIMEOUT:g} s") from None
        except URL_ERRORS as exc:
            raise InstallError(f"{what}: {type(exc).__name__}: {exc}") from None
        return bytes(body)

    async def _download(self, spec: EngineSpec, asset: ReleaseAsset, downloads: Path) -> Path:
        if not asset.sha256:
            raise InstallError(
                f"{asset.name}: the release publishes no sha256 digest; refusing to install an unverified archive"
            )
        # An archive is smaller than what it unpacks to: past the unpack cap it cannot be one.
        if asset.size > self.limits.max_bytes:
            raise InstallError(
                f"{asset.name}: {human_size(asset.size)} is more than an archive may unpack to "
                f"({human_size(self.limits.max_bytes)}, unpack_max_bytes)"
            )
        await INSTALL.run(_make_room, downloads, asset.size, asset.name)
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
        return await fetch(
            self.client,
            asset.url,
            downloads / f"{asset.sha256[:16]}-{asset.name}",
            sha256=asset.sha256,
            size=asset.size or None,
            progress=progress,
            label=asset.name,
        )

    async def _prove(self, spec: EngineSpec, binary: Path, backend: str) -> str:
        self._progress(spec, "checking libraries (ldd)")
        missing = await self._missing(binary)
        if missing:
            missing = await self._try_os_packages(spec, missing, binary)
        if missing:
            raise proof.ProofError(self._missing_text(missing))
        self._progress(spec, f"running {binary.name} --version")
        line = await proof.engine_version(binary, time_limit=self.version_timeout)
        if backend in GPU_BACKENDS:
            self._progress(spec, f"running {binary.name} --list-devices")
            await self._prove_devices(binary, backend)
        return line

    async def _missing(self, binary: Path) -> list[str]:
        """What ``ldd`` finds missing for the binary and each ggml backend plugin beside it.

        The GPU backends are plugins (``libggml-cuda.so``, ``libggml-vulkan.so``,
        ``libggml-hip.so``) that llama-server loads at run time: ``ldd llama-server`` never
        names the CUDA runtime or the Vulkan loader they need; ``ldd`` on the plugin does.
        """
        missing = await proof.missing_libraries(binary)
        plugins = await INSTALL.run(_backend_plugins, binary.parent)
        for plugin in plugins:
            missing += [lib for lib in await proof.missing_libraries(plugin) if lib not in missing]
        return missing

    def device_environment(self, backend: str, devices: list[int] | None = None) -> dict[str, str]:
        """The variables that give an engine of ``backend`` these GPUs (default: all the node's).

        Only for the backend the node's GPU indices are for (HostFacts.gpu_backend); another
        backend (a pinned Vulkan build on an NVIDIA node) sees whatever it finds.
        """
        parsed = parse_backend(backend)
        if parsed is None or parsed not in GPU_BACKENDS or parsed != self.platform.gpu_backend:
            return {}
        chosen = list(self.platform.gpus) if devices is None else devices
        if not chosen:
            return {}
        env = {VISIBLE_DEVICES_ENV[parsed]: ",".join(map(str, chosen))}
        if parsed == "cuda":
            # CUDA numbers GPUs fastest-first by default; nvidia-smi (whose indices placement
            # uses) numbers them by PCI bus. This makes the two agree.
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return env

    async def _prove_devices(self, binary: Path, backend: Backend) -> None:
        ours = backend == self.platform.gpu_backend
        await proof.listed_devices(
            binary,
            prefix=DEVICE_PREFIX[backend],
            expected=len(self.platform.gpus) if ours and self.platform.gpus else 1,
            env=self.device_environment(backend),
            time_limit=max(self.version_timeout, 60.0),
        )

    def degraded(self) -> str:
        """Why this node, which has GPUs, runs its llama.cpp engines on the CPU ("" when it does not).

        Degraded when every proven llama.cpp install is a CPU build (and there is at least one).
        """
        if not self.platform.has_gpus:
            return ""
        backends = {
            inst.backend or "cpu"
            for (name, version), inst in self._installed.items()
            if name == "llama.cpp" and self.status(name, version) == EngineInstall.INSTALLED
        }
        if not backends or backends != {"cpu"}:
            return ""
        if self.platform.backend == "cpu":
            return f"this node has {self.platform.gpu_words()} and runs the CPU build: pinned to cpu by engine_backend"
        return f"this node has {self.platform.gpu_words()} but its llama.cpp engine is a CPU build"

    async def _try_os_packages(self, spec: EngineSpec | None, missing: list[str], binary: Path) -> list[str]:
        """With ``allow_os_packages`` and root: update the package index once, install, look again."""
        manager = proof.package_manager()
        if not self.allow_os_packages or manager is None or not proof.can_install_packages():
            return missing
        packages, _unknown = proof.packages_for(missing, manager, self.known_packages)
        if not packages:
            return missing
        if spec is not None:
            self._progress(spec, f"updating the package index ({manager})")
        # Once per install: a fresh image (or one whose lists are months old) has no lists to
        # find the package in, and `apt-get install` fails with "Unable to locate package".
        await proof.update_package_index(manager)
        if spec is not None:
            self._progress(spec, f"installing OS packages: {' '.join(packages)}")
        await proof.install_packages(manager, packages)
        return await proof.missing_libraries(binary)

    def _missing_text(self, missing: list[str]) -> str:
        """The failure for missing libraries: each with its package, and what the operator runs."""
        manager = proof.package_manager()
        why_not = ""
        if self.allow_os_packages and not proof.can_install_packages():
            why_not = (
                f"allow_os_packages cannot: llmgw-node runs as uid {os.geteuid()}, not root; then run "
                "llmgw-node engines check"
            )
        elif not self.allow_os_packages:
            why_not = "or set allow_os_packages when the node runs as root"
        return proof.install_hint(missing, manager, self.known_packages, why_not=why_not)

    # ------------------------------------------------------------------ re-check

    async def check(self, name: str, version: str, *, verify_archives: bool = False) -> EngineState:
        """Prove an installed engine again (ldd and --version); report failure in its own words.

        ``verify_archives``: when the install kept its archives (``keep_engine_archives``), hash
        each again and compare it with the digest its kept release index publishes, after
        checking that index against the digest recorded at install and, with
        ``release_signing_keys``, its signature (``llmgw-node engines check``).
        """
        key = (name, version)
        async with self._lock(key):
            inst = self._installed.get(key)
            if inst is None:
                return self.state(name, version)
            try:
                missing = await self._missing(inst.binary) if inst.binary.exists() else []
                if not inst.binary.exists():
                    raise proof.ProofError(f"{inst.binary} is gone")
                if missing:
                    missing = await self._try_os_packages(None, missing, inst.binary)
                if missing:
                    raise proof.ProofError(self._missing_text(missing))
                line = await proof.engine_version(inst.binary, time_limit=self.version_timeout)
                backend = parse_backend(inst.backend)
                if backend in GPU_BACKENDS and name in ARCHIVE_ENGINES:
                    assert backend is not None
                    await self._prove_devices(inst.binary, backend)
                if verify_archives and inst.provenance is not None and inst.provenance.archives_kept:
                    await FILES.run(
                        _verify_kept, self.root / name / version, inst.provenance, self.signing_keys, abandon=True
                    )
            except proof.ProofError as exc:
                del self._installed[key]
                return self._set(
                    key, EngineInstall.FAILED, f"re-check: {exc}", binary=str(inst.binary), provenance=inst.provenance
                )
            return self._set_installed(key, line)

    async def check_all(self) -> None:
        """Re-check every archive install; reinstall those control still wants and that broke."""
        for key in sorted(self._installed):
            if self.status(*key) != EngineInstall.INSTALLED:
                continue
            state = await self.check(*key)
            if EngineInstall(state.status) is EngineInstall.FAILED and key in self._wanted:
                log.warning("engine %s %s broke since it was installed; reinstalling", *key)
                await self.install(self._wanted[key])
        # Installs that failed earlier get another try each round: a mirror may be back, a
        # release may have been fixed. The re-check interval is the backoff.
        for key, spec in sorted(self._wanted.items()):
            if (
                self.status(*key) == EngineInstall.FAILED
                and spec.name in ARCHIVE_ENGINES
                and not bad_names(spec)
                and not self._backing_off(spec)
            ):
                await self.install(spec)
        for eng in self.configured:
            await self._prove_configured(eng)

    async def run_rechecks(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            await self.check_all()


def bad_names(spec: EngineSpec) -> str:
    """Why ``spec``'s name or version may not name a folder, or ""."""
    try:
        check_engine_name(spec.name)
        check_version(spec.version)
    except BadName as exc:
        return str(exc)
    return ""


def _make_room(downloads: Path, size: int, name: str) -> None:
    downloads.mkdir(parents=True, exist_ok=True)
    check_room(downloads, size, f"downloading {name}")


def _write_new(folder: Path, name: str, data: bytes) -> None:
    """A file of ours in an install folder: never one the archive brought, never through a link."""
    try:
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        raise InstallError(f"the archive has its own {name}; refusing it") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _recorded_provenance(info: dict[str, object], marker: Path) -> EngineProvenance | None:
    """The provenance an install manifest records; for a manifest older than provenance, what it has.

    None when it would not pass control's checks of a node's report (``wire.check_from_node``):
    an engine state control refuses would not be reported at all, and the engine runs either way.
    """
    provenance = _read_provenance(info, marker)
    if provenance is None:
        return None
    try:
        check_from_node(provenance, "provenance")
    except WireError as exc:
        log.warning(
            "install manifest has a provenance control would refuse", extra={"path": str(marker), "error": str(exc)}
        )
        return None
    return provenance


def _read_provenance(info: dict[str, object], marker: Path) -> EngineProvenance | None:
    if "provenance" in info:
        try:
            return converter.structure(info["provenance"], EngineProvenance)
        except Exception:  # a damaged manifest: the install still runs, its origin is unknown
            log.warning("install manifest has an unreadable provenance", extra={"path": str(marker)})
            return None
    assets = info.get("assets")
    if not isinstance(assets, list):
        return None
    installed_at = info.get("installed_at")
    return EngineProvenance(
        source=str(info.get("source", "")),
        index_sha256="",
        assets=[
            AssetProvenance(str(a.get("name", "")), "", str(a.get("sha256", "")), 0)
            for a in assets
            if isinstance(a, dict)
        ],
        installed_at=float(installed_at) if isinstance(installed_at, int | float) else 0.0,
    )


def _verify_kept(folder: Path, provenance: EngineProvenance, keys: list[PublicKey]) -> None:
    """The kept index is the one installed from, still signed; each kept archive matches it."""
    try:
        with open(folder / INDEX_COPY, "rb") as handle:
            body = handle.read(MAX_RELEASE_JSON + 1)
    except OSError as exc:
        raise proof.ProofError(f"the kept release index cannot be read: {exc.strerror or exc}") from None
    if provenance.index_sha256 and hashlib.sha256(body).hexdigest() != provenance.index_sha256:
        raise proof.ProofError("the kept release index no longer matches the sha256 recorded at install")
    if keys:
        try:
            signature = (folder / SIGNATURE_COPY).read_bytes()[: MAX_SIGNATURE_BYTES + 1]
        except FileNotFoundError:
            raise proof.ProofError("the kept release index is not signed, and release_signing_keys is set") from None
        try:
            verify(body, signature, keys)
        except SignatureError as exc:
            raise proof.ProofError(f"the kept release index: {exc}") from None
    try:
        published = {a.name: a.sha256 for a in parse_release(json_loads(body)) if not a.refused}
    except (ValueError, ReleaseError) as exc:
        raise proof.ProofError(f"the kept release index is unreadable: {exc}") from None
    for asset in provenance.assets:
        try:
            check_asset_name(asset.name)
        except BadName as exc:
            raise proof.ProofError(f"the install manifest names a bad archive: {exc}") from None
        path = folder / ARCHIVES_DIR / asset.name
        if not path.is_file() or path.is_symlink():
            raise proof.ProofError(f"the kept archive {asset.name} is gone")
        digest = _sha256_of(path)
        expected = published.get(asset.name)
        if expected is None:
            raise proof.ProofError(f"the kept release index does not list {asset.name}")
        if digest != expected:
            raise proof.ProofError(
                f"the kept archive {asset.name} has sha256 {digest}, not the {expected} its release index publishes"
            )


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _write_marker(staging: Path, info: dict[str, object]) -> None:
    # O_EXCL | O_NOFOLLOW: an archive that brought its own marker (or a link by that name)
    # cannot have it written through, or pass for an install record.
    try:
        fd = os.open(staging / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        raise InstallError(f"the archive has its own {MARKER}; refusing it") from None
    with os.fdopen(fd, "w") as handle:
        json.dump(info, handle, indent=2)


def _backend_plugins(folder: Path) -> list[Path]:
    """The ggml backend plugins beside an engine (``libggml-<backend>.so``), each once."""
    try:
        return sorted(
            p
            for p in folder.glob("libggml-*.so*")
            if p.is_file() and not p.is_symlink() and not p.name.startswith(("libggml-base", "libggml-cpu"))
        )
    except OSError:
        return []


def _runtime_words(chosen: list[ReleaseAsset]) -> str:
    runtime = [a.name for a in chosen if a.name.startswith("cudart-")]
    if runtime:
        return f"cudart archive {runtime[0]}"
    wheels = [a.name.split("-py3-", 1)[0].replace("-", "==", 1) for a in chosen if is_runtime_wheel(a.name)]
    return f"wheels {', '.join(wheels)}" if wheels else ""


def _gather_wheel_libraries(wheels: Path, beside: Path) -> None:
    """The shared libraries of unpacked NVIDIA wheels (``nvidia/<lib>/lib/*.so*``) beside the
    engine, where its ``$ORIGIN`` rpath finds them; the rest of the wheels goes."""
    for lib in sorted(wheels.glob("*/nvidia/*/lib/*.so*")):
        if lib.is_file() and not lib.is_symlink() and not (beside / lib.name).exists():
            os.replace(lib, beside / lib.name)
    shutil.rmtree(wheels)


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _rename_into_place(staging: Path, final: Path, staging_root: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if final.exists():
        # A broken earlier install: move it aside in one step, then delete it.
        old = Path(tempfile.mkdtemp(prefix="old-", dir=staging_root))
        os.replace(final, old / "x")
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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
