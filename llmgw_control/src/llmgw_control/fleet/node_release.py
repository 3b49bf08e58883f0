"""``llmgw-control release``: the exact set of wheels a node installs, taken from ``uv.lock``.

A node must install what was tested, not "the latest compatible version" of its dependencies on
the day it is onboarded: a release is every wheel ``llmgw-node`` needs at the exact versions of
the lock, each checked against the lock's sha256, plus the two llmgw wheels built from the same
tree. Onboarding serves the current release; its install script carries every digest (the
script's own digest is in the install command) and installs with ``pip --require-hashes
--no-index``, so nothing is resolved, built or fetched from anywhere else at install time.

Layout, under ``<files_dir>/node-releases/`` (else ``<data_dir>/node-releases/``)::

    <id>/                   one release: <node version>-<12 hex of its requirements' sha256>
        *.whl               llmgw_shared, llmgw_node and every dependency, for every target
        requirements.txt    name==version --hash=sha256:... for each; markers where a target lacks it
        release.json        id, versions, targets, the lock's sha256, every file with sha256 and size
    current -> <id>         the release onboarding serves (replaced in one rename)

``release prepare`` writes a release and makes it current; the same inputs give the same id, so
running it again changes nothing. ``release use ID`` makes an earlier one current again (a fleet
rollback: nodes then "upgrade" to it). ``release list`` shows them.

Targets are (CPython minor version, machine): a wheel set covers the Pythons and architectures
its nodes run. Linux glibc (manylinux) wheels only, the oldest glibc each package offers, so a
release runs on the widest range of machines.

About 580 lines: reading the lock, choosing a wheel per target, fetching and checking, and the
release folder's layout are one chain over the same few types; split, each part would import
every other one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs
import httpx2
from packaging.markers import InvalidMarker, Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from llmgw_shared.hashing import file_sha256

RELEASES_DIR = "node-releases"
CURRENT = "current"
MANIFEST = "release.json"
REQUIREMENTS = "requirements.txt"
NODE = "llmgw-node"
SHARED = "llmgw-shared"
# What a node may run: the Pythons llmgw supports (requires-python >= 3.11) that have wheels
# today, and the two machine kinds llama.cpp publishes Linux builds for.
DEFAULT_PYTHONS = ("3.11", "3.12", "3.13")
DEFAULT_ARCHS = ("x86_64", "aarch64")
# A release id names a folder and a URL path: the node version and a digest, nothing else.
RELEASE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\-]{0,63}-[0-9a-f]{12}")
# Files served from a release: plain wheel names only (no separator, no leading dot).
WHEEL_FILE = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._+\-!]{0,199}\.whl")
# The largest wheel in the lock is under 10 MB (cryptography, psycopg-binary); a download that
# runs past the size the lock records is cut there, whatever its server says.
DOWNLOAD_TIMEOUT = 300.0
# The glibc a legacy manylinux tag stands for (PEP 600).
_LEGACY_GLIBC = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_(.+)")


class NodeReleaseError(Exception):
    """A release cannot be made or used; the text says what to do."""


@attrs.frozen(order=True)
class WheelTarget:
    python: tuple[int, int]
    arch: str

    @property
    def name(self) -> str:
        return f"cp{self.python[0]}{self.python[1]}-{self.arch}"

    def environment(self) -> dict[str, str]:
        """PEP 508 marker values for a CPython of this version on Linux on this machine."""
        version = f"{self.python[0]}.{self.python[1]}"
        return {
            "python_version": version,
            "python_full_version": f"{version}.0",
            "implementation_version": f"{version}.0",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "os_name": "posix",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": self.arch,
            "platform_release": "",
            "platform_version": "",
            "extra": "",
        }

    def tags(self) -> list[Tag]:
        """The wheel tags pip on such a node accepts, most preferred first (glibc from new to old)."""
        glibcs = [f"manylinux_2_{minor}_{self.arch}" for minor in range(50, 4, -1)]
        legacy = [f"{name}_{self.arch}" for name in _LEGACY_GLIBC]
        interpreter = f"cp{self.python[0]}{self.python[1]}"
        platforms = [*glibcs, *legacy]
        return [
            *cpython_tags(self.python, [interpreter], platforms),
            *compatible_tags(self.python, interpreter, platforms),
        ]


def parse_target(python: str, arch: str) -> WheelTarget:
    match = re.fullmatch(r"3\.(\d{1,2})", python)
    if match is None or int(match[1]) < 11:
        raise NodeReleaseError(f"--python {python!r}: use a CPython version such as 3.11 (3.11 or newer)")
    if not re.fullmatch(r"[a-z0-9_]{1,16}", arch):
        raise NodeReleaseError(f"--arch {arch!r}: use a machine name as `uname -m` prints it, e.g. x86_64 or aarch64")
    return WheelTarget((3, int(match[1])), arch)


# --------------------------------------------------------------------------- the lock


@attrs.frozen
class LockedWheel:
    filename: str
    url: str
    sha256: str
    size: int
    tags: frozenset[Tag]


@attrs.frozen
class Locked:
    name: str
    version: str
    workspace: bool
    wheels: tuple[LockedWheel, ...]


class Lock:
    """uv.lock's packages, and the closure of one package's dependencies for a target."""

    def __init__(self, text: str, *, source: str = "uv.lock") -> None:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise NodeReleaseError(f"{source}: not a uv lock file: {exc}") from None
        if not isinstance(data.get("package"), list):
            raise NodeReleaseError(f"{source}: not a uv lock file (no [[package]] tables)")
        self.source = source
        self.sha256 = hashlib.sha256(text.encode()).hexdigest()
        self._packages: dict[str, list[dict[str, Any]]] = {}
        for package in data["package"]:
            self._packages.setdefault(canonicalize_name(package["name"]), []).append(package)

    def _find(self, dep: dict[str, Any]) -> dict[str, Any]:
        candidates = self._packages.get(canonicalize_name(dep["name"]), [])
        if "version" in dep:
            candidates = [p for p in candidates if p.get("version") == dep["version"]]
        if "source" in dep:
            candidates = [p for p in candidates if p.get("source") == dep["source"]]
        if len(candidates) != 1:
            raise NodeReleaseError(
                f"{self.source}: cannot tell which {dep['name']} is meant ({len(candidates)} "
                "match); is the lock current? (uv lock)"
            )
        return candidates[0]

    def closure(self, root: str, target: WheelTarget) -> dict[str, Locked]:
        """Every package ``root`` needs on ``target``, by canonical name, ``root`` included."""
        env = target.environment()
        out: dict[str, Locked] = {}
        todo = [self._find({"name": root})]
        while todo:
            package = todo.pop()
            name = canonicalize_name(package["name"])
            if name in out:
                continue
            out[name] = _locked(package)
            deps = list(package.get("dependencies", []))
            for dep in list(deps):
                for extra in dep.get("extra", []):
                    deps += self._find(dep).get("optional-dependencies", {}).get(extra, [])
            for dep in deps:
                marker = dep.get("marker")
                try:
                    if marker and not Marker(marker).evaluate(env):
                        continue
                except InvalidMarker as exc:
                    raise NodeReleaseError(f"{self.source}: {dep['name']}: bad marker {marker!r}: {exc}") from None
                todo.append(self._find(dep))
        return out


def _locked(package: dict[str, Any]) -> Locked:
    source = package.get("source", {})
    workspace = any(k in source for k in ("editable", "virtual", "directory"))
    wheels = []
    for entry in package.get("wheels", []):
        filename = unquote(urlsplit(entry["url"]).path.rsplit("/", 1)[-1])
        hash_text = str(entry.get("hash", ""))
        if not hash_text.startswith("sha256:"):
            continue
        try:
            _, _, _, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue
        wheels.append(
            LockedWheel(filename, entry["url"], hash_text.removeprefix("sha256:"), int(entry.get("size", 0)), tags)
        )
    return Locked(canonicalize_name(package["name"]), str(package["version"]), workspace, tuple(wheels))


def _glibc(tags: Iterable[Tag]) -> tuple[int, int]:
    """The oldest glibc a wheel's platform tags name ((0, 0) for a pure wheel)."""
    found = []
    for tag in tags:
        if tag.platform == "any":
            return (0, 0)
        for legacy, version in _LEGACY_GLIBC.items():
            if tag.platform.startswith(legacy + "_"):
                found.append(version)
        match = _MANYLINUX.fullmatch(tag.platform)
        if match:
            found.append((int(match[1]), int(match[2])))
    return min(found) if found else (99, 99)


def choose_wheel(package: Locked, target: WheelTarget) -> LockedWheel:
    """The wheel pip on ``target`` would accept that asks least of the machine (the oldest glibc)."""
    order = {tag: i for i, tag in enumerate(target.tags())}
    fitting = [
        (w, min(order[t] for t in w.tags if t in order)) for w in package.wheels if any(t in order for t in w.tags)
    ]
    if not fitting:
        raise NodeReleaseError(
            f"{package.name} {package.version} has no wheel for CPython "
            f"{target.python[0]}.{target.python[1]} on {target.arch} in the lock: nodes build "
            "nothing, so leave that target out (--python, --arch)"
        )
    return min(fitting, key=lambda pair: (_glibc(pair[0].tags), pair[1]))[0]


# --------------------------------------------------------------------------- prepare


@attrs.frozen
class Pinned:
    name: str
    version: str
    # (file, sha256, size) of each wheel chosen for it, over every target.
    files: tuple[tuple[str, str, int], ...]
    targets: frozenset[WheelTarget]


def requirements_text(pinned: list[Pinned], targets: list[WheelTarget], node_version: str, lock_sha256: str) -> str:
    """``name==version --hash=...`` per distribution; a marker when only some targets need it."""
    lines = [
        f"# llmgw-node {node_version}: every distribution pinned to the sha256 of its wheels "
        f"(uv.lock sha256 {lock_sha256[:16]}). Install with pip --require-hashes --no-index.",
        f"# targets: {' '.join(t.name for t in targets)}",
    ]
    for p in sorted(pinned, key=lambda p: (p.name, Version(p.version))):
        marker = ""
        if p.targets != frozenset(targets):
            marker = " ; " + " or ".join(
                f"(python_version == '{t.python[0]}.{t.python[1]}' and platform_machine == '{t.arch}')"
                for t in sorted(p.targets)
            )
        hashes = " ".join(f"--hash=sha256:{sha}" for sha in sorted({sha for _, sha, _ in p.files}))
        lines.append(f"{p.name}=={p.version}{marker} {hashes}")
    return "\n".join(lines) + "\n"


def _workspace_wheel(dist_dir: Path, name: str, version: str) -> Path:
    prefix = f"{name.replace('-', '_')}-{version}-"
    found = sorted(p for p in dist_dir.glob(f"{prefix}*.whl") if p.is_file()) if dist_dir.is_dir() else []
    if not found:
        raise NodeReleaseError(
            f"no {name} {version} wheel in {dist_dir}: build them with `uv build --wheel "
            f"--all-packages --out-dir {dist_dir}` in the tree uv.lock is in"
        )
    if len(found) > 1:
        raise NodeReleaseError(
            f"{dist_dir} has more than one {name} {version} wheel "
            f"({', '.join(p.name for p in found)}): keep the one built from this tree"
        )
    return found[0]


def _requires(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
        if metadata is None:
            raise NodeReleaseError(f"{wheel.name} has no METADATA: not a wheel")
        text = archive.read(metadata).decode("utf-8", errors="replace")
    out = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            try:
                out.append(Requirement(line.partition(":")[2].strip()))
            except InvalidRequirement as exc:
                raise NodeReleaseError(f"{wheel.name}: {exc}") from None
    return out


def _check_requires(wheel: Path, closure: dict[str, Locked], target: WheelTarget) -> None:
    """The wheel's own dependencies are what the lock pins: a lock older than pyproject.toml
    would otherwise make every node's install fail on a missing or different package."""
    env = target.environment()
    for req in _requires(wheel):
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        locked = closure.get(canonicalize_name(req.name))
        if locked is None:
            raise NodeReleaseError(
                f"{wheel.name} needs {req} on {target.name}, which uv.lock does not pin: "
                "run `uv lock` and rebuild the wheels"
            )
        if req.specifier and Version(locked.version) not in req.specifier:
            raise NodeReleaseError(
                f"{wheel.name} needs {req}, but uv.lock pins {locked.name} {locked.version}: run "
                "`uv lock` and rebuild the wheels"
            )


def fetch_file(
    client: httpx2.Client, wheel: LockedWheel, source: str | None, dest: Path, *, pinned_by: str = "uv.lock"
) -> None:
    """Copy or download ``wheel`` to ``dest``, refusing anything that is not the locked bytes.

    Written beside ``dest`` as ``<name>.part`` and renamed when checked: a refused or cut download
    leaves nothing, and a file already at ``dest`` stays as it was.
    """
    digest = hashlib.sha256()
    written = 0
    limit = wheel.size or None
    tmp = dest.with_name(dest.name + ".part")
    try:
        with open(tmp, "wb") as out:
            if source is not None and not source.startswith(("http://", "https://")):
                path = Path(source) / wheel.filename
                if not path.is_file():
                    raise NodeReleaseError(f"{wheel.filename} is not in {source}")
                with open(path, "rb") as handle:
                    while block := handle.read(1 << 20):
                        written += len(block)
                        if limit is not None and written > limit:
                            break
                        digest.update(block)
                        out.write(block)
            else:
                url = f"{source.rstrip('/')}/{wheel.filename}" if source else wheel.url
                try:
                    with client.stream("GET", url, follow_redirects=True, timeout=DOWNLOAD_TIMEOUT) as resp:
                        if resp.status_code != 200:
                            raise NodeReleaseError(f"{wheel.filename}: HTTP {resp.status_code} from {url}")
                        for block in resp.iter_bytes():
                            written += len(block)
                            if limit is not None and written > limit:
                                break
                            digest.update(block)
                            out.write(block)
                except httpx2.HTTPError as exc:
                    raise NodeReleaseError(f"{wheel.filename}: {type(exc).__name__} from {url}: {exc}") from None
        if limit is not None and written != limit:
            raise NodeReleaseError(
                f"{wheel.filename}: {written if written <= limit else 'more than ' + str(limit)} "
                f"bytes, not the {limit} {pinned_by} records: not the locked file"
            )
        if digest.hexdigest() != wheel.sha256:
            raise NodeReleaseError(
                f"{wheel.filename}: sha256 {digest.hexdigest()} is not the {wheel.sha256} "
                f"{pinned_by} records: not the locked file, refusing it"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


@attrs.frozen
class NodeReleasePlan:
    """What a release will hold, before anything is fetched."""

    id: str
    node_version: str
    shared_version: str
    lock_sha256: str
    targets: list[WheelTarget]
    # Dependency wheels to fetch (each checked against the lock), and the two built llmgw wheels.
    wheels: list[LockedWheel]
    workspace: list[Path]
    requirements: str


def plan_release(lock_path: Path, dist_dir: Path, targets: list[WheelTarget]) -> NodeReleasePlan:
    """The release for the lock at ``lock_path``, the llmgw wheels in ``dist_dir`` and ``targets``."""
    try:
        lock = Lock(lock_path.read_text(), source=str(lock_path))
    except OSError as exc:
        raise NodeReleaseError(
            f"cannot read {lock_path}: {exc.strerror or exc} (run this in the llmgw source tree, or pass --lock)"
        ) from None
    if not targets:
        raise NodeReleaseError("no targets: name at least one --python and --arch")
    closures = {t: lock.closure(NODE, t) for t in targets}
    node = closures[targets[0]][NODE]
    shared = closures[targets[0]].get(SHARED)
    if shared is None:
        raise NodeReleaseError(f"{lock_path}: llmgw-node does not depend on llmgw-shared: not llmgw's lock")
    node_wheel = _workspace_wheel(dist_dir, NODE, node.version)
    shared_wheel = _workspace_wheel(dist_dir, SHARED, shared.version)
    for target, closure in closures.items():
        _check_requires(node_wheel, closure, target)
        _check_requires(shared_wheel, closure, target)
    # By (name, version): a lock may pin different versions for different Pythons.
    chosen: dict[tuple[str, str], dict[str, tuple[LockedWheel, set[WheelTarget]]]] = {}
    for target, closure in closures.items():
        for name, package in closure.items():
            if package.workspace:
                continue
            wheel = choose_wheel(package, target)
            chosen.setdefault((name, package.version), {}).setdefault(wheel.filename, (wheel, set()))[1].add(target)
    pinned = [
        Pinned(
            name,
            version,
            tuple((w.filename, w.sha256, w.size) for w, _ in files.values()),
            frozenset(t for _, ts in files.values() for t in ts),
        )
        for (name, version), files in chosen.items()
    ]
    for name, version, path in ((NODE, node.version, node_wheel), (SHARED, shared.version, shared_wheel)):
        pinned.append(Pinned(name, version, ((path.name, file_sha256(path), path.stat().st_size),), frozenset(targets)))
    requirements = requirements_text(pinned, targets, node.version, lock.sha256)
    wheels = sorted(
        {w.filename: w for files in chosen.values() for w, _ in files.values()}.values(), key=lambda w: w.filename
    )
    return NodeReleasePlan(
        id=f"{node.version}-{hashlib.sha256(requirements.encode()).hexdigest()[:12]}",
        node_version=node.version,
        shared_version=shared.version,
        lock_sha256=lock.sha256,
        targets=list(targets),
        wheels=wheels,
        workspace=[node_wheel, shared_wheel],
        requirements=requirements,
    )


def fetch_wheels(wheels: list[LockedWheel], dest: Path, *, wheels_from: str | None = None, say: Any = print) -> None:
    """Each wheel into ``dest`` from ``wheels_from`` (a directory or a URL) or the lock's URL, checked."""
    with httpx2.Client() as client:
        for i, wheel in enumerate(wheels, 1):
            say(f"[{i}/{len(wheels)}] {wheel.filename}")
            fetch_file(client, wheel, wheels_from, dest / wheel.filename)


def prepare(
    lock_path: Path,
    dist_dir: Path,
    releases: Path,
    targets: list[WheelTarget],
    *,
    wheels_from: str | None = None,
    say: Any = print,
) -> str:
    """Write the release for ``lock_path`` and the wheels in ``dist_dir``; make it current; return its id."""
    plan = plan_release(lock_path, dist_dir, targets)
    releases.mkdir(parents=True, exist_ok=True)
    final = releases / plan.id
    if (final / MANIFEST).is_file():
        say(f"release {plan.id} is already prepared")
    else:
        staging = Path(tempfile.mkdtemp(prefix=f".{plan.id}-", dir=releases))
        try:
            fetch_wheels(plan.wheels, staging, wheels_from=wheels_from, say=say)
            for path in plan.workspace:
                shutil.copyfile(path, staging / path.name)
            (staging / REQUIREMENTS).write_text(plan.requirements)
            files = sorted(p for p in staging.iterdir() if p.name.endswith(".whl"))
            manifest = {
                "id": plan.id,
                "node_version": plan.node_version,
                "shared_version": plan.shared_version,
                "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "lock_sha256": plan.lock_sha256,
                "targets": [t.name for t in plan.targets],
                "requirements_sha256": hashlib.sha256(plan.requirements.encode()).hexdigest(),
                "files": [{"name": p.name, "sha256": file_sha256(p), "size": p.stat().st_size} for p in files],
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            staging.chmod(0o755)
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    use(releases, plan.id)
    return plan.id


# --------------------------------------------------------------------------- reading and switching


@attrs.frozen
class Release:
    id: str
    path: Path
    node_version: str
    targets: list[str]
    requirements: str
    files: dict[str, str]  # wheel file name -> sha256
    created_at: str


def load_release(releases: Path, release_id: str) -> Release:
    """A prepared release, checked: its id, its file names, its requirements' digest."""
    if not RELEASE_ID.fullmatch(release_id):
        raise NodeReleaseError(f"{release_id!r} is not a release id (use `llmgw-control release list`)")
    path = releases / release_id
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        requirements = (path / REQUIREMENTS).read_text()
    except FileNotFoundError:
        raise NodeReleaseError(f"no release {release_id} in {releases}") from None
    except (OSError, ValueError) as exc:
        raise NodeReleaseError(f"release {release_id} is unreadable: {exc}") from None
    if not isinstance(manifest, dict):
        raise NodeReleaseError(f"release {release_id}: {MANIFEST} is not a JSON object; prepare it again")
    if hashlib.sha256(requirements.encode()).hexdigest() != manifest.get("requirements_sha256"):
        raise NodeReleaseError(f"release {release_id}: {REQUIREMENTS} does not match its {MANIFEST}; prepare it again")
    files = {}
    for entry in manifest.get("files", []):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not WHEEL_FILE.fullmatch(name):
            raise NodeReleaseError(f"release {release_id}: {MANIFEST} names a file {name!r} that is not a wheel")
        files[name] = str(entry.get("sha256", ""))
    return Release(
        release_id,
        path,
        str(manifest.get("node_version", "")),
        list(manifest.get("targets", [])),
        requirements,
        files,
        str(manifest.get("created_at", "")),
    )


def current_id(releases: Path) -> str | None:
    try:
        target = os.readlink(releases / CURRENT)
    except OSError:
        return None
    return target if RELEASE_ID.fullmatch(target) else None


def use(releases: Path, release_id: str) -> None:
    """Make ``release_id`` current, in one rename: onboarding serves either the old or the new one."""
    load_release(releases, release_id)
    tmp = releases / f".{CURRENT}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(release_id, tmp)
    os.replace(tmp, releases / CURRENT)


def releases_dir_for(files_dir: str, data_dir: Path) -> Path:
    return (Path(files_dir) if files_dir else data_dir) / RELEASES_DIR
