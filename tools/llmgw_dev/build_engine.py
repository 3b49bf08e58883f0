"""Build a real ``llama-server`` from PyPI's llama.cpp sources and pack it like an upstream release.

The tests and the demo need a real engine on machines that cannot reach GitHub. PyPI's
``llama-cpp-python`` sdist carries a full llama.cpp tree, so we download that (pinned by version
and sha256), compile only the ``llama-server`` target with flags that work offline and give a
portable, relocatable result, and pack it as ``llama-b<N>-bin-linux-<arch>.tar.gz`` exactly the
way upstream releases look, so the node's installer is exercised on a real archive.

Everything lands in the cache (``$LLMGW_CACHE`` or ``~/.cache/llmgw``); a second run is instant,
and a second concurrent run waits on a file lock instead of corrupting the cache.

Standard library only, so it runs under any Python; cmake and ninja come from the project's
virtual environment (PyPI wheels) when the system has none, so only a C++ compiler is needed.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

if not __package__:  # run as a script: make the llmgw_dev package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llmgw_dev import pypi

SDIST_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
BUILD_NUMBER = 11312
BUILD_COMMIT = "0c1e57098"
# A fixed mtime (2026-10-01, the day of commit 0c1e57098) for every archive member, so the archive
# is byte-for-byte reproducible.
BUILD_EPOCH = 1790812800
RELEASE_TAG = f"b{BUILD_NUMBER}"

CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    # Native would bake -march=native into the build: not portable to other nodes.
    "-DGGML_NATIVE=OFF",
    # OpenMP adds a run-time dependency on libgomp.so.1 for no gain on small models.
    "-DGGML_OPENMP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    # The prebuilt UI is downloaded from a hub at build time, the built one needs npm.
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}",
    f"-DLLAMA_BUILD_COMMIT={BUILD_COMMIT}",
]


def cache_dir() -> Path:
    root = os.environ.get("LLMGW_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llmgw")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def arch_name() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def archive_name() -> str:
    return f"llama-{RELEASE_TAG}-bin-linux-{arch_name()}.tar.gz"


def say(message: str) -> None:
    print(f"[build-engine] {message}", file=sys.stderr, flush=True)


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Serialise builders: a second concurrent run waits, then finds the finished result."""
    lock_path = cache_dir() / f".{name}.lock"
    with open(lock_path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another build holds {lock_path}; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist() -> Path:
    target = cache_dir() / "src" / SDIST_NAME
    if target.exists() and sha256_of(target) == SDIST_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    url, _ = pypi.find_file("llama-cpp-python", SDIST_NAME)
    pypi.download(url, target, expected_sha256=SDIST_SHA256, label=SDIST_NAME)
    return target


def unpack_sources(sdist: Path, work: Path) -> Path:
    say("unpacking llama.cpp sources")
    prefix = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
    dest = work / "llama.cpp"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for member in members:
            member.name = member.name[len(prefix):]
        tar.extractall(dest, members=[m for m in members if m.name], filter="data")
    return dest


def build_tool(name: str) -> str | None:
    """A build tool on PATH, or the one the project's virtual environment got from PyPI."""
    beside_python = Path(sys.executable).with_name(name)
    if beside_python.exists():
        return str(beside_python)
    return shutil.which(name)


def compile_server(sources: Path, work: Path) -> Path:
    if not (shutil.which("c++") or shutil.which("g++")):
        raise SystemExit("no C++ compiler found: install one (Debian/Ubuntu: apt-get install g++)")
    cmake = build_tool("cmake")
    if cmake is None:
        raise SystemExit("no cmake found: run this with the project's virtual environment, or install cmake")
    ninja = build_tool("ninja")
    generator = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja else []
    build = work / "build"
    say("configuring (cmake)")
    subprocess.run([cmake, "-S", str(sources), "-B", str(build), *generator, *CMAKE_FLAGS],
                   check=True, stdout=subprocess.DEVNULL)
    jobs = str(os.cpu_count() or 2)
    say(f"compiling llama-server with {jobs} jobs; about 10 minutes on 2 cores the first time")
    started = time.monotonic()
    proc = subprocess.Popen([cmake, "--build", str(build), "--target", "llama-server", "-j", jobs],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    last_percent = ""
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail, line.rstrip()][-40:]
        progress = _progress(line)
        if progress and progress != last_percent:
            last_percent = progress
            say(f"compiling: {progress} ({time.monotonic() - started:.0f} s)")
    if proc.wait() != 0:
        print("\n".join(tail), file=sys.stderr)
        raise SystemExit("llama-server build failed (last lines above)")
    return build / "bin"


def _progress(line: str) -> str:
    """``[ 42%]`` from make, ``[12/130]`` from ninja, as a percentage."""
    if not line.startswith("["):
        return ""
    inside = line[1:line.find("]")].strip()
    if inside.endswith("%"):
        return inside
    done, _, total = inside.partition("/")
    if done.isdigit() and total.isdigit() and int(total):
        return f"{int(done) * 100 // int(total)}%"
    return ""


def soname(path: Path) -> str:
    out = subprocess.run(["objdump", "-p", str(path)], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "SONAME":
            return parts[1]
    return path.name


def pack_release(bin_dir: Path, work: Path) -> Path:
    say("packing the release archive")
    top = f"llama-{RELEASE_TAG}"
    stage = work / "stage" / top
    stage.mkdir(parents=True)
    shutil.copy2(bin_dir / "llama-server", stage / "llama-server")
    for lib in sorted(bin_dir.glob("*.so*")):
        if lib.is_symlink():
            continue
        shutil.copy2(lib, stage / soname(lib))
    for item in stage.iterdir():
        subprocess.run(["strip", "--strip-unneeded", str(item)], check=False)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.mtime = BUILD_EPOCH
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            return info
        for path in [stage, *sorted(stage.iterdir())]:
            tar.add(path, arcname=str(path.relative_to(stage.parent)), recursive=False, filter=normalise)
    out = cache_dir() / "engines" / archive_name()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    with open(partial, "wb") as handle, gzip.GzipFile(fileobj=handle, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    os.replace(partial, out)
    (out.parent / (out.name + ".sha256")).write_text(f"{sha256_of(out)}  {out.name}\n")
    return out


def unpack_for_local_use(archive: Path) -> Path:
    """An unpacked copy for tests and the demo that run llama-server directly."""
    dest = archive.parent / f"llama-{RELEASE_TAG}"
    if (dest / "llama-server").exists():
        return dest
    tmp = Path(tempfile.mkdtemp(dir=archive.parent))
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    os.replace(tmp / f"llama-{RELEASE_TAG}", dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure_engine() -> Path:
    """Return the release archive, building it when the cache lacks it."""
    out = cache_dir() / "engines" / archive_name()
    checksum = out.parent / (out.name + ".sha256")
    with cache_lock("engine"):
        if not (out.exists() and checksum.exists()
                and checksum.read_text().split()[0] == sha256_of(out)):
            with tempfile.TemporaryDirectory(prefix="llmgw-build-", dir=cache_dir()) as tmp:
                work = Path(tmp)
                sources = unpack_sources(fetch_sdist(), work)
                pack_release(compile_server(sources, work), work)
        unpack_for_local_use(out)
    return out


def server_binary() -> Path:
    archive = ensure_engine()
    return archive.parent / f"llama-{RELEASE_TAG}" / "llama-server"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", choices=["archive", "binary", "sha256"], default="binary",
                        help="what to print on stdout once the engine is ready")
    args = parser.parse_args(argv)
    archive = ensure_engine()
    if args.print == "archive":
        print(archive)
    elif args.print == "sha256":
        print(sha256_of(archive))
    else:
        print(server_binary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
