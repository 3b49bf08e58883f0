"""Installing the real llama-server archive from a GitHub-shaped release served on 127.0.0.1."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx2
import pytest
import trio
from node import hostile
from node.conftest import TAG
from node.release_server import FileServer

from llmgw_node.engines.manager import EngineManager, RetryPolicy
from llmgw_node.engines.release import Platform
from llmgw_shared.wire import EngineSpec, EngineState
from support.waiting import wait_until

CPU = Platform(os="linux", arch="x86_64", cuda=False)


def manager(data: Path, client: httpx2.AsyncClient, seen: list[EngineState]) -> EngineManager:
    return EngineManager(data, client, CPU, on_change=seen.append)


async def test_clean_install_reports_progress_then_installed(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data, "llama-b11312-bin-win-cpu-x64.zip": b"not for linux"})
    seen: list[EngineState] = []
    async with httpx2.AsyncClient() as client:
        mgr = manager(tmp_path, client, seen)
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "installed", state.describe()
    assert state.describe() == f"installed {TAG}"
    assert "build 11312" in state.reported_version
    binary = Path(state.binary)
    assert binary == tmp_path / "engines" / "llama.cpp" / TAG / f"llama-{TAG}" / "llama-server"
    assert os.access(binary, os.X_OK)
    details = [s.detail for s in seen if s.status == "installing"]
    assert any(d.startswith(f"downloading {name} (6 MB, ") and d.endswith("%)") for d in details), details
    assert f"downloading {name} (6 MB, 100%)" in details
    assert "checking libraries (ldd)" in details and "running llama-server --version" in details
    # Nothing is left in staging, and the downloaded archive is not kept once unpacked.
    assert not any((tmp_path / "engines" / ".staging").iterdir())
    assert not any((tmp_path / "engines" / ".downloads").iterdir())


async def test_installed_engine_is_found_again_and_proven_on_restart(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    async with httpx2.AsyncClient() as client:
        await manager(tmp_path, client, []).install(EngineSpec("llama.cpp", TAG, files.release_api()))
        seen: list[EngineState] = []
        again = manager(tmp_path, client, seen)
        await again.load()
    assert [(s.name, s.version, s.status) for s in again.states()] == [("llama.cpp", TAG, "installed")]
    assert again.binary("llama.cpp", TAG) is not None


async def test_wrong_digest_is_refused_and_leaves_nothing_installed(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data}, digests={name: "0" * 64})
    async with httpx2.AsyncClient() as client:
        mgr = manager(tmp_path, client, [])
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "failed"
    assert f"{name}: sha256 " in state.detail and f"differs from the published {'0' * 64}" in state.detail
    assert not (tmp_path / "engines" / "llama.cpp" / TAG).exists()
    assert mgr.binary("llama.cpp", TAG) is None


async def test_no_fitting_asset_names_what_was_offered(tmp_path: Path, files: FileServer) -> None:
    files.publish(TAG, {"llama-b11312-bin-macos-arm64.zip": b"x", "llama-b11312-bin-ubuntu-vulkan-x64.zip": b"y"})
    async with httpx2.AsyncClient() as client:
        state = await manager(tmp_path, client, []).install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "failed"
    assert "no asset fits linux/x86_64" in state.detail
    assert "llama-b11312-bin-macos-arm64.zip (built for macos)" in state.detail
    assert (
        "llama-b11312-bin-ubuntu-vulkan-x64.zip (a Vulkan build and this node has no Vulkan driver that lists a GPU)"
    ) in state.detail


async def test_missing_release_is_reported(tmp_path: Path, files: FileServer) -> None:
    async with httpx2.AsyncClient() as client:
        state = await manager(tmp_path, client, []).install(EngineSpec("llama.cpp", "b1", files.release_api()))
    assert state.status == "failed" and state.detail.endswith("/releases/tags/b1: HTTP 404")


def _archive_without(data: bytes, library: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as dst:
        for member in src.getmembers():
            if member.name.endswith("/" + library):
                continue
            dst.addfile(member, src.extractfile(member) if member.isreg() else None)
    return out.getvalue()


async def test_archive_missing_a_library_is_refused_naming_it(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: _archive_without(data, "libggml-cpu.so.0")})
    async with httpx2.AsyncClient() as client:
        mgr = manager(tmp_path, client, [])
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "failed"
    assert state.describe() == "failed: missing library: libggml-cpu.so.0"
    assert not (tmp_path / "engines" / "llama.cpp" / TAG).exists()
    assert not any((tmp_path / "engines" / ".staging").iterdir())


def _archive_with_broken_binary(data: bytes) -> bytes:
    out = io.BytesIO()
    script = b"#!/bin/sh\necho 'error: this build wants a newer CPU' >&2\nexit 3\n"
    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as dst:
        for member in src.getmembers():
            if member.name.endswith("/llama-server"):
                member.size = len(script)
                dst.addfile(member, io.BytesIO(script))
            else:
                dst.addfile(member, src.extractfile(member) if member.isreg() else None)
    return out.getvalue()


async def test_binary_whose_version_fails_is_refused(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: _archive_with_broken_binary(data)})
    async with httpx2.AsyncClient() as client:
        state = await manager(tmp_path, client, []).install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "failed"
    assert state.detail == "llama-server --version exited with status 3: error: this build wants a newer CPU"
    assert not (tmp_path / "engines" / "llama.cpp" / TAG).exists()


async def test_recheck_notices_a_library_deleted_after_install_and_reinstalls(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    spec = EngineSpec("llama.cpp", TAG, files.release_api())
    seen: list[EngineState] = []
    async with httpx2.AsyncClient() as client:
        mgr = manager(tmp_path, client, seen)
        mgr.want([spec])
        state = await mgr.install(spec)
        Path(state.binary).with_name("libggml-base.so.0").unlink()
        seen.clear()
        await mgr.check_all()
    statuses = [s.describe() for s in seen]
    assert statuses[0] == "failed: re-check: missing library: libggml-base.so.0"
    assert statuses[-1] == f"installed {TAG}"
    assert Path(state.binary).with_name("libggml-base.so.0").exists()


async def test_recheck_reports_a_broken_engine_control_no_longer_wants(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    async with httpx2.AsyncClient() as client:
        mgr = manager(tmp_path, client, [])
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
        Path(state.binary).with_name("libllama.so.0").unlink()
        await mgr.check_all()
    assert mgr.state("llama.cpp", TAG).describe() == "failed: re-check: missing library: libllama.so.0"
    assert mgr.binary("llama.cpp", TAG) is None


@pytest.mark.parametrize("version_line", ["vllm 0.11.0"])
async def test_engine_configured_by_path_is_proven_and_reported(tmp_path: Path, version_line: str) -> None:
    from llmgw_node.config import ConfiguredEngine

    script = tmp_path / "vllm"
    script.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    script.chmod(0o755)
    broken = tmp_path / "sglang"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    async with httpx2.AsyncClient() as client:
        mgr = EngineManager(
            tmp_path,
            client,
            CPU,
            configured=[
                ConfiguredEngine(name="vllm", path=str(script), version="0.11.0"),
                ConfiguredEngine(name="sglang", path=str(broken)),
                ConfiguredEngine(name="nothing", path=str(tmp_path / "absent")),
            ],
        )
        await mgr.load()
    by_name = {s.name: s for s in mgr.states()}
    assert by_name["vllm"].describe() == "configured 0.11.0"
    assert by_name["vllm"].reported_version == version_line
    assert by_name["sglang"].status == "failed" and "exited with status 1" in by_name["sglang"].detail
    assert by_name["nothing"].detail == f"{tmp_path / 'absent'} is not an executable file"


async def test_malicious_archive_is_refused_and_staging_is_cleaned(tmp_path: Path, files: FileServer) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        good = tarfile.TarInfo(f"llama-{TAG}/llama-server")
        good.size = 3
        tar.addfile(good, io.BytesIO(b"bin"))
        link = tarfile.TarInfo(f"llama-{TAG}/libggml.so.0")
        link.type = tarfile.SYMTYPE
        link.linkname = "../../../../etc/passwd"
        tar.addfile(link)
    files.publish(TAG, {f"llama-{TAG}-bin-linux-x64.tar.gz": out.getvalue()})
    async with httpx2.AsyncClient() as client:
        state = await manager(tmp_path, client, []).install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.describe() == (
        f"failed: entry 'llama-{TAG}/libggml.so.0': symlink to '../../../../etc/passwd' points outside "
        "the install directory"
    )
    assert not (tmp_path / "engines" / "llama.cpp").exists()
    assert not any((tmp_path / "engines" / ".staging").iterdir())


def _fake_apt_get(tmp_path: Path, body: str) -> Path:
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    script = bindir / "apt-get"
    # `update` succeeds unless FAKE_APT_UPDATE says what it fails with; `install` runs ``body``.
    script.write_text(
        '#!/bin/sh\necho "$@" >> "$FAKE_APT_LOG"\n'
        'if [ "$1" = update ]; then [ -z "${FAKE_APT_UPDATE:-}" ] && exit 0; '
        'echo "$FAKE_APT_UPDATE" >&2; exit 100; fi\n' + body
    )
    script.chmod(0o755)
    return bindir


@pytest.mark.parametrize("apt_works", [True, False])
async def test_missing_library_is_installed_from_an_os_package_when_allowed(
    tmp_path: Path,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
    apt_works: bool,
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: _archive_without(data, "libggml-cpu.so.0")})
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.extractfile(f"llama-{TAG}/libggml-cpu.so.0")
        assert member is not None
        (tmp_path / "libggml-cpu.so.0").write_bytes(member.read())
    # No real package provides this library and no test may change the system's libraries, so a
    # fake apt-get "installs" the package by putting the library where the loader finds it.
    body = (
        'cp "$FAKE_LIB" "$(dirname "$(find "$FAKE_DATA/engines/.staging" -name llama-server)")/"\n'
        if apt_works
        else "echo 'E: Unable to locate package libggml-cpu-test' >&2\nexit 100\n"
    )
    bindir = _fake_apt_get(tmp_path, body)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APT_LOG", str(tmp_path / "apt.log"))
    monkeypatch.setenv("FAKE_LIB", str(tmp_path / "libggml-cpu.so.0"))
    monkeypatch.setenv("FAKE_DATA", str(tmp_path / "data"))
    seen: list[EngineState] = []
    async with httpx2.AsyncClient() as client:
        mgr = EngineManager(
            tmp_path / "data",
            client,
            CPU,
            allow_os_packages=True,
            on_change=seen.append,
            known_packages={"apt": {"libggml-cpu.so.0": "libggml-cpu-test"}},
        )
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    # The index update comes first, once: a machine whose lists are old or were never fetched
    # cannot find the package otherwise.
    assert (tmp_path / "apt.log").read_text() == "update\ninstall -y --no-install-recommends libggml-cpu-test\n"
    described = [s.describe() for s in seen]
    assert described.index("installing: updating the package index (apt)") < described.index(
        "installing: installing OS packages: libggml-cpu-test"
    )
    if apt_works:
        assert state.describe() == f"installed {TAG}"
    else:
        assert state.describe() == (
            "failed: apt-get install libggml-cpu-test failed: E: Unable to locate package libggml-cpu-test"
        )


async def test_a_failed_index_update_is_the_reason_and_nothing_is_installed(
    tmp_path: Path,
    files: FileServer,
    engine_archive: tuple[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: _archive_without(data, "libggml-cpu.so.0")})
    bindir = _fake_apt_get(tmp_path, "exit 0\n")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APT_LOG", str(tmp_path / "apt.log"))
    monkeypatch.setenv(
        "FAKE_APT_UPDATE", "E: The repository 'http://mirror bookworm Release' does not have a Release file."
    )
    async with httpx2.AsyncClient() as client:
        mgr = EngineManager(
            tmp_path / "data",
            client,
            CPU,
            allow_os_packages=True,
            known_packages={"apt": {"libggml-cpu.so.0": "libggml-cpu-test"}},
            retry=RetryPolicy(min_s=0.001, max_s=0.001),
        )
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
        assert state.describe() == (
            "failed: apt-get update failed: E: The repository 'http://mirror bookworm "
            "Release' does not have a Release file."
        )
        # Once per install: a second attempt updates once more, and never got as far as installing.
        await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert (tmp_path / "apt.log").read_text() == "update\nupdate\n"


def test_the_failure_names_the_package_and_the_command_that_installs_it() -> None:
    from llmgw_node.engines.proof import install_hint

    text = install_hint(["libgomp.so.1", "libfoo.so.9", "libcurl.so.4"], "apt", why_not="why")
    assert text == (
        "missing library: libgomp.so.1 (package libgomp1); missing library: libfoo.so.9; "
        "missing library: libcurl.so.4 (package libcurl4); to install: apt-get update && "
        "apt-get install -y libcurl4 libgomp1, as root (why)"
    )
    assert install_hint(["libgomp.so.1"], "dnf").endswith("to install: dnf install -y libgomp, as root")
    # Nothing known: the libraries alone, no guessed package.
    assert install_hint(["libfoo.so.9"], "apt") == "missing library: libfoo.so.9"
    assert install_hint(["libgomp.so.1"], None) == "missing library: libgomp.so.1"


NOBODY = 65534


def _binary_needing(tmp_path: Path, library: str) -> bytes:
    """A real ELF ``llama-server`` whose only missing library is ``library`` (linked to a stub, then
    the stub is gone), packed as a llama.cpp release archive."""
    work = tmp_path / "build"
    work.mkdir()
    (work / "main.c").write_text("int main(void) { return 0; }\n")
    subprocess.run(
        ["cc", "-shared", "-o", str(work / library), f"-Wl,-soname,{library}", "-x", "c", "/dev/null"],
        check=True,
        capture_output=True,
    )
    binary = work / "llama-server"
    subprocess.run(
        ["cc", "-o", str(binary), str(work / "main.c"), "-Wl,--no-as-needed", str(work / library)],
        check=True,
        capture_output=True,
    )
    (work / library).unlink()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(binary, f"llama-{TAG}/llama-server")
    return out.getvalue()


@pytest.mark.slow  # left out of the quick tier: builds a binary and runs the daemon under setpriv
@pytest.mark.skipif(os.geteuid() != 0, reason="arranging a non-root daemon (setpriv to uid 65534) needs root")
@pytest.mark.skipif(
    shutil.which("cc") is None or shutil.which("setpriv") is None,
    reason="needs cc (to build a binary that lacks a library) and setpriv",
)
async def test_a_daemon_that_is_not_root_names_the_package_and_the_command_and_never_runs_apt(
    tmp_path: Path, files: FileServer
) -> None:
    # What the shipped unit is: allow_os_packages set, the daemon running as a plain user that
    # apt-get would refuse. It must not try, and must say exactly what the operator runs.
    library = "libvulkan.so.1"
    name = f"llama-{TAG}-bin-ubuntu-x64.tar.gz"
    files.publish(TAG, {name: _binary_needing(tmp_path, library)})
    if (await trio.run_process(["sh", "-c", f"ldconfig -p | grep -q {library}"], check=False)).returncode == 0:
        pytest.skip(f"{library} is installed on this machine, so it cannot be missing")
    owned = tmp_path / "nobody"
    owned.mkdir()
    os.chown(owned, NOBODY, NOBODY)
    bindir = _fake_apt_get(tmp_path, "exit 0\n")
    config = owned / "node.toml"
    config.write_text(f'data_dir = "{owned / "data"}"\nallow_os_packages = true\n')
    # setpriv keeps only CAP_DAC_READ_SEARCH, so the non-root process can reach the test's
    # Python under /root; it can read, not write, anything it does not own.
    result = await trio.run_process(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "--inh-caps=+dac_read_search",
            "--ambient-caps=+dac_read_search",
            sys.executable,
            "-m",
            "llmgw_node",
            "engines",
            "install",
            "llama.cpp",
            TAG,
            "--release-api",
            files.release_api(),
            "--config",
            str(config),
        ],
        env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_APT_LOG": str(owned / "apt.log")},
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    last = result.stderr.decode().strip().splitlines()[-1]
    assert result.returncode == 1
    assert last == (
        f"llmgw-node: llama.cpp {TAG}: failed: missing library: {library} (package libvulkan1); "
        "to install: apt-get update && apt-get install -y libvulkan1, as root (allow_os_packages "
        f"cannot: llmgw-node runs as uid {NOBODY}, not root; then run llmgw-node engines check)"
    )
    assert not (owned / "apt.log").exists()


async def test_a_cuda_build_that_lists_no_gpu_is_refused_in_the_engines_own_words(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    # The real build stands in for the CUDA one: no CUDA plugin loads (as when the runtime is
    # missing or the driver too old), so it would start on the CPU. It used to be installed as
    # the node's CUDA engine; now --list-devices must show the GPU the node reported.
    _name, data = engine_archive
    files.publish(
        TAG,
        {
            f"llama-{TAG}-bin-ubuntu-x64.tar.gz": data,
            f"llama-{TAG}-bin-ubuntu-cuda-12.4-x64.tar.gz": data,
        },
    )
    seen: list[EngineState] = []
    async with httpx2.AsyncClient() as client:
        plat = Platform(os="linux", arch="x86_64", cuda=True, nvidia_driver="550.54.15", gpu_backend="cuda", gpus=(0,))
        mgr = EngineManager(tmp_path, client, plat, on_change=seen.append)
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "failed"
    assert state.detail.startswith(
        "llama-server --list-devices (CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0) "
        "lists 0 CUDA device(s), and the node reported 1 GPU(s); the engine said: "
    )
    assert "Available devices: | (none)" in state.detail
    assert not (tmp_path / "engines" / "llama.cpp" / TAG).exists()


# --------------------------------------------------------------------------- issue 14: hostile releases


def _outside(tmp_path: Path, data: Path) -> set[str]:
    """Everything under ``tmp_path`` that is not under the data directory."""
    return {
        os.path.join(d, n)
        for d, dirs, names in os.walk(tmp_path)
        for n in [*dirs, *names]
        if not os.path.join(d, n).startswith(str(data))
    }


@pytest.mark.parametrize(
    ("listed_as", "why"),
    [
        (
            {"name": f"llama-{TAG}/../../../../x-bin-ubuntu-x64.tar.gz"},
            f"asset name 'llama-{TAG}/../../../../x-bin-ubuntu-x64.tar.gz' is not valid: use a plain file name",
        ),
        ({"digest": "sha256:../../../x"}, "digest 'sha256:../../../x' is not valid: use 'sha256:' and 64 hex digits"),
        ({"size": 0}, "size 0 is not a positive number of bytes"),
    ],
    ids=["asset-name", "digest", "size"],
)
async def test_names_in_the_release_never_reach_a_path(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes], listed_as: dict[str, object], why: str
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data}, listed_as={name: listed_as})
    box = tmp_path / "box" / "data"
    box.mkdir(parents=True)
    before = _outside(tmp_path, box)
    async with httpx2.AsyncClient() as client:
        state = await manager(box, client, []).install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "failed" and why in state.detail, state.detail
    assert state.detail.startswith("no asset fits linux/x86_64: ")
    assert _outside(tmp_path, box) == before
    assert files.requests == []  # refused before any download


@pytest.mark.parametrize("version", [".", "", "..", "../../x", "b1/../..", "b1\n", "-rf"])
async def test_a_version_that_is_not_one_name_installs_nothing_and_deletes_nothing(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes], version: str
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    async with httpx2.AsyncClient() as client:
        mgr = manager(tmp_path, client, [])
        good = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
        before = _outside(tmp_path / "engines" / ".downloads", tmp_path / "nothing") | {
            os.path.join(d, n) for d, dirs, names in os.walk(tmp_path) for n in [*dirs, *names]
        }
        state = await mgr.install(EngineSpec("llama.cpp", version, files.release_api()))
    assert state.status == "failed"
    assert (
        state.detail == f"version {version!r} is not valid: use 1-64 letters, digits, '.', '_', '+' or '-', "
        "starting with a letter or digit"
    )
    assert await trio.Path(good.binary).is_file()
    assert {os.path.join(d, n) for d, dirs, names in os.walk(tmp_path) for n in [*dirs, *names]} == before
    assert len(files.index_requests) == 1  # the bad version never even fetched the index


ARCHIVE_CASES = hostile.engine_archive_cases(f"llama-{TAG}")


@pytest.mark.parametrize(("case", "suffix", "archive", "message"), ARCHIVE_CASES, ids=[c[0] for c in ARCHIVE_CASES])
async def test_each_bad_archive_is_a_failed_state_with_its_reason(
    tmp_path: Path, files: FileServer, case: str, suffix: str, archive: bytes, message: str
) -> None:
    asset = f"llama-{TAG}-bin-ubuntu-x64{suffix}"
    files.publish(TAG, {asset: archive})
    data = tmp_path.joinpath("a", "b", "c", "d", "data")  # an escape four levels up stays in tmp_path
    data.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    before = _outside(tmp_path, data)
    async with httpx2.AsyncClient() as client:
        mgr = manager(data, client, [])
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "failed"
    assert message in state.describe(), state.describe()
    assert "\n" not in state.describe()
    assert _outside(tmp_path, data) == before and not (tmp_path / "PWNED").exists()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not any((data / "engines" / ".staging").iterdir())
    # A refused archive does not stay on the disk either.
    assert not any((data / "engines" / ".downloads").iterdir())


@pytest.mark.slow  # left out of the quick tier: waits out the backoff
async def test_a_failed_install_is_retried_only_after_a_backoff(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {f"llama-{TAG}-bin-ubuntu-x64.tar.gz": hostile.truncated_tar_gz()})
    spec = EngineSpec("llama.cpp", TAG, files.release_api())
    async with httpx2.AsyncClient() as client:
        mgr = EngineManager(tmp_path, client, CPU, retry=RetryPolicy(min_s=0.5, max_s=0.5))
        assert mgr.want([spec]) == [spec]
        failed_at = trio.current_time()
        assert (await mgr.install(spec)).status == "failed"
        # Control asking again at once (a reconnect, the reconciler's next pass) is not a retry.
        for _ in range(3):
            assert mgr.want([spec]) == []
            await mgr.check_all()
        assert len(files.index_requests) == 1
        await wait_until(lambda: mgr.want([spec]) == [spec], timeout=30)
        assert trio.current_time() - failed_at >= 0.5
        files.publish(TAG, {name: data})
        assert (await mgr.install(spec)).status == "installed"
    assert len(files.index_requests) == 2


async def test_a_release_index_that_is_too_big_is_refused(tmp_path: Path, files: FileServer) -> None:
    files.releases[f"/repos/ggml-org/llama.cpp/releases/tags/{TAG}"] = {
        "assets": [{"name": "x" * 100, "size": 1, "browser_download_url": "x", "digest": ""}] * 40000
    }
    async with httpx2.AsyncClient() as client:
        state = await manager(tmp_path, client, []).install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.detail.endswith("larger than 4 MB; not a release index"), state.detail
