"""``llmgw-control release prepare|list|use``: every wheel a node installs, pinned to uv.lock.

Run as an operator runs it (the command, on this tree's uv.lock and wheels it built), with the
dependency wheels from a mirror on 127.0.0.1; then the release is installed the way the node's
install script installs it, offline, with pip --require-hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import trio
from system.releases import BIN, HERE, LOCK, NODE_PYTHON, node_dist, prepare, repacked, wheel_mirror, wheelhouse

from llmgw_control.fleet.node_release import (
    Lock,
    NodeReleaseError,
    WheelTarget,
    choose_wheel,
    load_release,
    parse_target,
)

__all__ = ["node_dist", "wheelhouse"]  # fixtures, used by name


def _wheels(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.whl"))


def _locked_closure() -> dict[str, str]:
    closure = Lock(LOCK.read_text()).closure("llmgw-node", HERE)
    return {name: p.version for name, p in closure.items()}


async def test_prepare_pins_every_wheel_of_the_lock_and_installs_offline_with_hashes(
    tmp_path: Path, node_dist: Path, wheelhouse: Path
) -> None:
    files = tmp_path / "files"
    async with wheel_mirror(wheelhouse) as mirror:
        done = await trio.to_thread.run_sync(prepare, files, node_dist, f"{mirror.base}/files")
        assert done.returncode == 0, done.stderr
        again = await trio.to_thread.run_sync(prepare, files, node_dist, f"{mirror.base}/files")
    releases = files / "node-releases"
    release_id = os.readlink(releases / "current")
    assert done.stdout.startswith(f"release {release_id} is current")
    # The same inputs are the same release: nothing is fetched or changed the second time.
    assert again.returncode == 0 and "is already prepared" in again.stderr and "[1/" not in again.stderr
    assert os.readlink(releases / "current") == release_id

    release = load_release(releases, release_id)
    pinned = {}
    for line in release.requirements.splitlines():
        if line.startswith("#"):
            continue
        spec, *hashes = line.split(" --hash=sha256:")
        name, version = spec.strip().split("==")
        pinned[name] = (version, hashes)
    # Exactly the lock's closure of llmgw-node, each at the lock's version, each with a digest
    # that is one of the lock's digests for it (the llmgw wheels: the built files' own).
    assert {n: v for n, (v, _) in pinned.items()} == _locked_closure()
    lock = tomllib.loads(LOCK.read_text())
    digests = {
        (p["name"], p["version"]): {w["hash"].removeprefix("sha256:") for w in p.get("wheels", [])}
        for p in lock["package"]
    }
    built = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in _wheels(node_dist)}
    for name, (version, hashes) in pinned.items():
        if name.startswith("llmgw-"):
            prefix = f"{name.replace('-', '_')}-{version}-"
            assert hashes == [digest for file, digest in built.items() if file.startswith(prefix)]
        else:
            assert hashes and set(hashes) <= digests[(name, version)], name
    manifest = json.loads((release.path / "release.json").read_text())
    assert manifest["targets"] == [HERE.name] and manifest["node_version"] == release.node_version
    for entry in manifest["files"]:
        assert hashlib.sha256((release.path / entry["name"]).read_bytes()).hexdigest() == entry["sha256"]

    # What the node's script does with it: a new venv, nothing but these files, every hash checked.
    venv = tmp_path / "venv"
    await trio.run_process([str(NODE_PYTHON), "-m", "venv", str(venv)])
    installed = await trio.run_process(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "--isolated",
            "install",
            "--quiet",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--require-hashes",
            "--no-index",
            "--only-binary",
            ":all:",
            "--find-links",
            str(release.path),
            "-r",
            str(release.path / "requirements.txt"),
        ],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr.decode()
    version = await trio.run_process([str(venv / "bin" / "llmgw-node"), "--version"], capture_stdout=True)
    assert version.stdout.decode().strip() == f"llmgw-node {release.node_version}"
    listed = await trio.run_process(
        [str(BIN / "llmgw-control"), "release", "--files-dir", str(files), "list"], capture_stdout=True
    )
    assert listed.stdout.decode().startswith(f"* {release_id}  llmgw-node {release.node_version}, ")


async def test_a_wheel_that_is_not_the_locked_file_is_refused_and_nothing_changes(
    tmp_path: Path, node_dist: Path, wheelhouse: Path
) -> None:
    files = tmp_path / "files"
    async with wheel_mirror(wheelhouse) as mirror:
        assert (await trio.to_thread.run_sync(prepare, files, node_dist, f"{mirror.base}/files")).returncode == 0
        before = os.readlink(files / "node-releases" / "current")
        # A mirror (or a compromised index) serving another build of the same name: one byte off.
        name = next(n for n in mirror.files if "/cryptography-" in n)
        mirror.files[name] = mirror.files[name][:-1] + bytes([mirror.files[name][-1] ^ 1])
        # A new release is wanted (a rebuilt node wheel), so every dependency is fetched again.
        rebuilt = repacked(node_dist, tmp_path / "dist2", level=1)
        other = await trio.to_thread.run_sync(prepare, files, rebuilt, f"{mirror.base}/files")
    assert other.returncode == 1
    wheel = name.rsplit("/", 1)[1]
    assert f"llmgw-control release: {wheel}: sha256 " in other.stderr
    assert "uv.lock records: not the locked file, refusing it" in other.stderr
    releases = files / "node-releases"
    assert os.readlink(releases / "current") == before
    assert sorted(p.name for p in releases.iterdir()) == sorted([before, "current"])


def test_a_lock_that_does_not_pin_what_the_wheel_needs_is_refused(tmp_path: Path, node_dist: Path) -> None:
    # pyproject.toml gained a dependency and nobody ran `uv lock`: every node install would fail.
    stale = tmp_path / "uv.lock"
    edge = '    { name = "cryptography" },\n    { name = "httpcore2", extra = ["trio"] },'
    assert edge in LOCK.read_text()
    stale.write_text(LOCK.read_text().replace(edge, '    { name = "httpcore2", extra = ["trio"] },', 1))
    result = subprocess.run(
        [
            str(BIN / "llmgw-control"),
            "release",
            "--files-dir",
            str(tmp_path / "f"),
            "prepare",
            "--lock",
            str(stale),
            "--dist",
            str(node_dist),
            "--python",
            "3.11",
            "--arch",
            "x86_64",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "needs cryptography>=46 on cp311-x86_64, which uv.lock does not pin: run `uv lock`" in result.stderr


def test_a_target_without_wheels_is_named(tmp_path: Path, node_dist: Path) -> None:
    result = subprocess.run(
        [
            str(BIN / "llmgw-control"),
            "release",
            "--files-dir",
            str(tmp_path / "f"),
            "prepare",
            "--lock",
            str(LOCK),
            "--dist",
            str(node_dist),
            "--python",
            "3.11",
            "--arch",
            "riscv64",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "has no wheel for CPython 3.11 on riscv64 in the lock: nodes build nothing" in result.stderr
    missing = subprocess.run(
        [
            str(BIN / "llmgw-control"),
            "release",
            "--files-dir",
            str(tmp_path / "f"),
            "prepare",
            "--lock",
            str(LOCK),
            "--dist",
            str(tmp_path / "empty"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 1 and "uv build --wheel --all-packages --out-dir" in missing.stderr


def test_the_oldest_glibc_wheel_is_chosen_for_each_target() -> None:
    lock = Lock(LOCK.read_text())
    crypto = lock.closure("llmgw-node", WheelTarget((3, 12), "aarch64"))["cryptography"]
    chosen = choose_wheel(crypto, WheelTarget((3, 12), "aarch64"))
    # abi3 built for 3.11 serves 3.12; manylinux2014 (glibc 2.17) runs on more machines than 2_28.
    assert chosen.filename.startswith("cryptography-") and "cp311-abi3-manylinux2014_aarch64" in chosen.filename
    cffi = lock.closure("llmgw-node", WheelTarget((3, 13), "x86_64"))["cffi"]
    assert "-cp313-cp313-" in choose_wheel(cffi, WheelTarget((3, 13), "x86_64")).filename
    for bad in ("3.10", "2.7", "3", "3.x"):
        with pytest.raises(NodeReleaseError, match="CPython version"):
            parse_target(bad, "x86_64")


def test_release_use_switches_back_and_refuses_what_is_not_a_release(tmp_path: Path) -> None:
    releases = tmp_path / "files" / "node-releases"

    def release(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "llmgw-control"), "release", "--files-dir", str(tmp_path / "files"), *args],
            capture_output=True,
            text=True,
            check=False,
        )

    assert "no releases in" in release("list").stdout
    for bad in ("../etc", "current", "0.1.0-zzzzzzzzzzzz", "0.1.0-0123456789ab"):
        result = release("use", bad)
        assert result.returncode == 1, bad
        assert "is not a release id" in result.stderr or "no release" in result.stderr
    assert not releases.exists() or not (releases / "current").exists()


@pytest.mark.parametrize("manifest", ["[]", '"x"', "null", "{"])
def test_a_release_json_that_is_not_an_object_is_an_unreadable_release(tmp_path: Path, manifest: str) -> None:
    # Onboarding reads release.json for every script it serves: a damaged one is a NodeReleaseError
    # (a 503 that says so from /install/node.sh), never an AttributeError (a 500).
    folder = tmp_path / "0.1.0-0123456789ab"
    folder.mkdir()
    (folder / "release.json").write_text(manifest)
    (folder / "requirements.txt").write_text("")
    with pytest.raises(NodeReleaseError, match=r"0\.1\.0-0123456789ab"):
        load_release(tmp_path, "0.1.0-0123456789ab")
