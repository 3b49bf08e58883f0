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


# Extra cmake flags per backend. "cpu" is the default build every test tier uses; the others are
# built only where a tier asks for them (the Vulkan one for the lavapipe system test, the CUDA one
# by ``dev.py gpu-check``). Each is cached under its own archive name, like upstream's
# ``llama-bN-bin-ubuntu-<backend>-x64.tar.gz`` (we say "linux": these are not upstream's Ubuntu
# builds, and the node accepts both words).
BACKEND_FLAGS: dict[str, list[str]] = {
    "cpu": [],
    # Needs libvulkan-dev and glslc (Debian: apt-get install libvulkan-dev glslc spirv-headers).
    "vulkan": ["-DGGML_VULKAN=ON"],
    # Needs the CUDA toolkit (nvcc); CMAKE_CUDA_ARCHITECTURES comes from the caller
    # (``native`` builds for the GPUs present, which is what gpu-check wants: minutes, not hours).
    "cuda": ["-DGGML_CUDA=ON"],
}


# ggml-vulkan at b11312 uses VK_EXT_layer_settings (vk::LayerSettingEXT), first in Vulkan-Headers
# 1.3.261; Debian 12's libvulkan-dev is 1.3.239. Debian 13's libvulkan-dev has them: fetched with
# apt-get from a trixie source of our own (never the system's apt configuration), checked against
# the sha256 pinned here and unpacked with `dpkg-deb -x` into <cache>/vulkan-headers, or named by
# LLMGW_VULKAN_INCLUDE. Headers only: the build still links the system's loader (libvulkan.so.1),
# which exports what ggml calls.
MIN_VULKAN_HEADER = 261
# Debian architecture -> (libvulkan-dev version in trixie, sha256 of its .deb).
VULKAN_DEV: dict[str, tuple[str, str]] = {
    "amd64": ("1.4.309.0-1", "8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a"),
}
DEBIAN_MIRROR = os.environ.get("LLMGW_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# apt-get update reads trixie's main index (about 10 MB); a download slower than this is stuck.
APT_TIMEOUT = 600


def vulkan_flags() -> list[str]:
    """cmake flags naming Vulkan headers new enough for ggml-vulkan, fetching them when none are; or SystemExit."""
    candidates = [
        os.environ.get("LLMGW_VULKAN_INCLUDE", ""),
        str(cache_dir() / "vulkan-headers" / "usr" / "include"),
        "/usr/include",
    ]
    for include in filter(None, candidates):
        if _header_version(Path(include) / "vulkan" / "vulkan_core.h") >= MIN_VULKAN_HEADER:
            return [f"-DVulkan_INCLUDE_DIR={include}"]
    return [f"-DVulkan_INCLUDE_DIR={fetch_vulkan_headers() / 'usr' / 'include'}"]


def _vulkan_help() -> str:
    return (
        f"the Vulkan build needs Vulkan headers 1.3.{MIN_VULKAN_HEADER} or newer (Debian 12 has 1.3.239): "
        "download Debian 13's libvulkan-dev .deb (apt-get download with a trixie source) and unpack it with "
        f"`dpkg-deb -x <deb> {cache_dir() / 'vulkan-headers'}`, or set LLMGW_VULKAN_INCLUDE; it also needs "
        "glslc and the system's libvulkan1"
    )


def fetch_vulkan_headers() -> Path:
    """Debian 13's libvulkan-dev, its .deb checked against VULKAN_DEV, unpacked into <cache>/vulkan-headers.

    apt-get runs with a source list, list directory and cache of its own in a temporary directory,
    so the system's apt configuration and state are neither used nor changed.
    """
    target = cache_dir() / "vulkan-headers"
    with cache_lock("vulkan-headers"):
        if _header_version(target / "usr" / "include" / "vulkan" / "vulkan_core.h") >= MIN_VULKAN_HEADER:
            return target
        if not (shutil.which("apt-get") and shutil.which("dpkg-deb") and shutil.which("dpkg")):
            raise SystemExit(_vulkan_help() + " (no apt-get/dpkg here to fetch them)")
        arch = subprocess.run(
            ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
        if arch not in VULKAN_DEV:
            raise SystemExit(_vulkan_help() + f" (no libvulkan-dev .deb is pinned for {arch})")
        version, sha256 = VULKAN_DEV[arch]
        with tempfile.TemporaryDirectory(prefix="llmgw-vulkan-", dir=cache_dir()) as tmp:
            work = Path(tmp)
            (work / "sources.list").write_text(f"deb [arch={arch}] {DEBIAN_MIRROR} trixie main\n")
            for sub in ("lists/partial", "cache/archives/partial"):
                (work / sub).mkdir(parents=True)
            options = [
                "-o",
                f"Dir::Etc::sourcelist={work / 'sources.list'}",
                "-o",
                "Dir::Etc::sourceparts=-",
                "-o",
                f"Dir::State::Lists={work / 'lists'}",
                "-o",
                f"Dir::Cache={work / 'cache'}",
                "-o",
                "APT::Get::List-Cleanup=0",
                "-o",
                "Debug::NoLocking=1",
            ]
            say(f"fetching Debian 13's libvulkan-dev {version} for its Vulkan headers")
            for command in (["update"], ["download", f"libvulkan-dev={version}"]):
                done = subprocess.run(
                    ["apt-get", "-q", *options, *command], cwd=work, capture_output=True, text=True, timeout=APT_TIMEOUT
                )
                if done.returncode != 0:
                    raise SystemExit(
                        f"apt-get {command[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
                        f"\n{_vulkan_help()}"
                    )
            debs = sorted(work.glob(f"libvulkan-dev_*_{arch}.deb"))
            if len(debs) != 1:
                raise SystemExit(f"apt-get download left {[d.name for d in debs]}, not one libvulkan-dev .deb")
            got = sha256_of(debs[0])
            if got != sha256:
                raise SystemExit(f"{debs[0].name}: sha256 {got} is not the pinned {sha256}: refusing it")
            unpacked = work / "unpacked"
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True, timeout=APT_TIMEOUT)
            if _header_version(unpacked / "usr" / "include" / "vulkan" / "vulkan_core.h") < MIN_VULKAN_HEADER:
                raise SystemExit(f"{debs[0].name} holds no Vulkan headers 1.3.{MIN_VULKAN_HEADER} or newer")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(unpacked, target)
    return target


def _header_version(core: Path) -> int:
    try:
        for line in core.read_text(errors="replace").splitlines():
            if line.startswith("#define VK_HEADER_VERSION "):
                return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def archive_name(backend: str = "cpu") -> str:
    variant = "" if backend == "cpu" else f"{backend}-"
    return f"llama-{RELEASE_TAG}-bin-linux-{variant}{arch_name()}.tar.gz"


def _unpacked_name(backend: str) -> str:
    return f"llama-{RELEASE_TAG}" if backend == "cpu" else f"llama-{RELEASE_TAG}-{backend}"


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
            member.name = member.name[len(prefix) :]
        tar.extractall(dest, members=[m for m in members if m.name], filter="data")
    return dest


def build_tool(name: str) -> str | None:
    """A build tool on PATH, or the one the project's virtual environment got from PyPI."""
    beside_python = Path(sys.executable).with_name(name)
    if beside_python.exists():
        return str(beside_python)
    return shutil.which(name)


def compile_server(sources: Path, work: Path, extra_flags: list[str] | None = None) -> Path:
    if not (shutil.which("c++") or shutil.which("g++")):
        raise SystemExit("no C++ compiler found: install one (Debian/Ubuntu: apt-get install g++)")
    cmake = build_tool("cmake")
    if cmake is None:
        raise SystemExit("no cmake found: run this with the project's virtual environment, or install cmake")
    ninja = build_tool("ninja")
    generator = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja else []
    build = work / "build"
    say("configuring (cmake)")
    subprocess.run(
        [cmake, "-S", str(sources), "-B", str(build), *generator, *CMAKE_FLAGS, *(extra_flags or [])],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    jobs = str(os.cpu_count() or 2)
    say(f"compiling llama-server with {jobs} jobs; about 10 minutes on 2 cores the first time")
    started = time.monotonic()
    proc = subprocess.Popen(
        [cmake, "--build", str(build), "--target", "llama-server", "-j", jobs],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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
    inside = line[1 : line.find("]")].strip()
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


def pack_release(bin_dir: Path, work: Path, backend: str = "cpu") -> Path:
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
    out = cache_dir() / "engines" / archive_name(backend)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    with open(partial, "wb") as handle, gzip.GzipFile(fileobj=handle, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    os.replace(partial, out)
    (out.parent / (out.name + ".sha256")).write_text(f"{sha256_of(out)}  {out.name}\n")
    return out


def unpack_for_local_use(archive: Path, backend: str = "cpu") -> Path:
    """An unpacked copy for tests and the demo that run llama-server directly."""
    dest = archive.parent / _unpacked_name(backend)
    if (dest / "llama-server").exists():
        return dest
    tmp = Path(tempfile.mkdtemp(dir=archive.parent))
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    os.replace(tmp / f"llama-{RELEASE_TAG}", dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


def is_built(backend: str = "cpu") -> bool:
    out = cache_dir() / "engines" / archive_name(backend)
    checksum = out.parent / (out.name + ".sha256")
    return out.exists() and checksum.exists() and checksum.read_text().split()[0] == sha256_of(out)


def ensure_engine(backend: str = "cpu", extra_flags: list[str] | None = None) -> Path:
    """Return the release archive for ``backend``, building it when the cache lacks it."""
    out = cache_dir() / "engines" / archive_name(backend)
    # The CPU build keeps its historical lock name so a builder of an older checkout still waits.
    with cache_lock("engine" if backend == "cpu" else f"engine-{backend}"):
        if not is_built(backend):
            with tempfile.TemporaryDirectory(prefix=f"llmgw-build-{backend}-", dir=cache_dir()) as tmp:
                work = Path(tmp)
                # A GPU machine without network builds from the sources `dev.py gpu-check --pack` packed.
                packed = os.environ.get("LLMGW_LLAMA_SOURCES")
                sources = unpack_sources(Path(packed) if packed else fetch_sdist(), work)
                flags = [
                    *BACKEND_FLAGS[backend],
                    *(vulkan_flags() if backend == "vulkan" else []),
                    *(extra_flags or []),
                ]
                pack_release(compile_server(sources, work, flags), work, backend)
        unpack_for_local_use(out, backend)
    return out


def server_binary(backend: str = "cpu") -> Path:
    archive = ensure_engine(backend)
    return archive.parent / _unpacked_name(backend) / "llama-server"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--print",
        choices=["archive", "binary", "sha256"],
        default="binary",
        help="what to print on stdout once the engine is ready",
    )
    parser.add_argument(
        "--backend", choices=sorted(BACKEND_FLAGS), default="cpu", help="which ggml backend to build in (default: cpu)"
    )
    args = parser.parse_args(argv)
    archive = ensure_engine(args.backend)
    if args.print == "archive":
        print(archive)
    elif args.print == "sha256":
        print(sha256_of(archive))
    else:
        print(server_binary(args.backend))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
