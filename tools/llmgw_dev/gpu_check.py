"""``python3 dev.py gpu-check``: llmgw on this machine's GPU, end to end, measured, in one table.

On a Linux machine with an NVIDIA GPU and no network:
1. the GPU and its driver (``nvidia-smi``), its compute capability;
2. a CUDA build of llama-server: ``--archive``/``LLMGW_CUDA_ARCHIVE`` (a release archive at hand),
   else the cached one, else built from the cached llama.cpp sources for this GPU's architecture
   only (``CMAKE_CUDA_ARCHITECTURES``; needs nvcc and a C++ compiler; a few minutes on 16 cores);
3. control and a node as processes (everything on 127.0.0.1); control serves that build and the
   tiny model; the node chooses, installs and proves the build (``--list-devices``), and places a
   GPU profile with every layer offloaded;
4. the offload verified: the node's proof, the engine's load log (``offloaded N/N layers to GPU``),
   and the replica's GPU memory as the node measured it (its PID in ``nvidia-smi``);
5. generation tokens/s: through the gateway, against the same engine build run directly on the
   GPU, and directly on the CPU (``--device none``); one table.

``--backend vulkan`` runs the same check on a Vulkan device (with ``LLMGW_TEST_SOFTWARE_GPUS=1``
even on Mesa's lavapipe), which is how it is exercised on machines without an NVIDIA GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import tomli_w

if not __package__:  # run as a script: make the llmgw_dev package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llmgw_dev import build_engine
from llmgw_dev.demo import stop, wait_healthy
from llmgw_dev.engine_proc import free_port
from llmgw_dev.served_files import place

BIN = Path(sys.executable).parent
TOKEN = "llmgw-join-gpu-check"
# The whole check must finish in 8 minutes on 16 cores; each wait is bounded well inside that.
START_DEADLINE = 240.0
HTTP_TIMEOUT = 120.0
# Engine threads: llama.cpp's threads spin at their barriers, so more threads than free cores makes
# CPU generation crawl (4 on 2 loaded cores: 2 tokens/s instead of thousands). Half the cores, 1-8.
THREADS = str(max(1, min(8, (os.cpu_count() or 2) // 2)))


class CheckFailed(Exception):
    pass


def say(message: str) -> None:
    print(f"[gpu-check] {message}", file=sys.stderr, flush=True)


def nvidia_gpu() -> dict[str, str]:
    """The first GPU's name, memory, driver and compute capability, from nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        raise CheckFailed("no nvidia-smi: this machine has no NVIDIA driver (try --backend vulkan)")
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 0 or not out.stdout.strip():
        raise CheckFailed(f"nvidia-smi failed: {(out.stderr or out.stdout).strip()[:300]}")
    name, memory, driver, cap = (f.strip() for f in out.stdout.splitlines()[0].split(","))
    return {"name": name, "memory": f"{memory} MiB", "driver": driver, "compute_cap": cap}


def gpu_archive(backend: str, given: str) -> Path:
    if given:
        path = Path(given)
        if not path.is_file():
            raise CheckFailed(f"{given}: no such archive")
        return path
    if backend == "cuda" and not build_engine.is_built("cuda"):
        if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
            raise CheckFailed("no CUDA build at hand (--archive, LLMGW_CUDA_ARCHIVE) and no nvcc to build one")
        cap = nvidia_gpu()["compute_cap"].replace(".", "")
        say(f"building llama-server with CUDA for compute capability {cap} from the cached sources")
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        return build_engine.ensure_engine(
            "cuda", [f"-DCMAKE_CUDA_ARCHITECTURES={cap}", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
        )
    return build_engine.ensure_engine(backend)


def post(url: str, body: dict[str, Any], key: str = "") -> dict[str, Any]:
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            result: dict[str, Any] = json.load(response)
            return result
    except urllib.error.HTTPError as exc:
        raise CheckFailed(f"{url}: HTTP {exc.code}: {exc.read()[:500].decode(errors='replace')}") from None


def get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        raise CheckFailed(f"{url}: HTTP {exc.code}: {exc.read()[:500].decode(errors='replace')}") from None


def tokens_per_second(url: str, model: str, tokens: int, rounds: int) -> tuple[float, float]:
    """(median wall-clock generation tokens/s, median of the engine's own predicted_per_second)."""
    wall, engine = [], []
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "temperature": 0}
    post(url + "/v1/chat/completions", {**body, "max_tokens": 4})  # warm: pipelines, caches
    for _ in range(rounds):
        started = time.monotonic()
        reply = post(url + "/v1/chat/completions", body)
        took = time.monotonic() - started
        wall.append(reply["usage"]["completion_tokens"] / took)
        timings = reply.get("timings") or {}
        if isinstance(timings, dict) and timings.get("predicted_per_second"):
            engine.append(float(timings["predicted_per_second"]))
    return statistics.median(wall), statistics.median(engine) if engine else 0.0


def start_direct(
    binary: Path, model: Path, args: list[str], log: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--alias", "tiny", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=str(binary.parent),
            process_group=0,
        )
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + START_DEADLINE
    try:
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise CheckFailed(f"llama-server exited with {proc.returncode} (see {log})")
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as response:
                    if response.status == 200:
                        return proc, url
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        raise CheckFailed(f"llama-server was not healthy within {START_DEADLINE:g} s (see {log})")
    except BaseException:
        stop(proc, 5)  # whatever ends the wait (a failure, Ctrl-C), the engine does not outlive it
        raise


def write_configs(root: Path, archive: Path, model: Path, ports: dict[str, int]) -> tuple[Path, Path]:
    files = root / "files"
    for kind, source in (("engines", archive), ("models", model)):
        place(source, files / kind / source.name)
    agents = f"http://127.0.0.1:{ports['agents']}"
    digest = "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()
    weights = {
        "url": f"{agents}/files/models/{model.name}",
        "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
        "size": model.stat().st_size,
    }
    control = {
        "listen": f"127.0.0.1:{ports['api']}",
        "admin_listen": f"127.0.0.1:{ports['admin']}",
        "data_dir": str(root / "control"),
        "log_format": "text",
        "agents": {"listen": f"127.0.0.1:{ports['agents']}", "files_dir": str(files), "join_token_digests": [digest]},
        # A VRAM claim makes it a GPU profile: placed on GPU 0 with every layer offloaded.
        "models": [
            {
                "name": "tiny",
                "profiles": [
                    {
                        "name": "gpu",
                        "weights": weights,
                        "context": 1024,
                        "parallel": 1,
                        "vram_mib": 256,
                        "start_timeout": START_DEADLINE,
                        "args": ["-t", THREADS],
                    }
                ],
            }
        ],
    }
    node = {
        "control": [f"ws://127.0.0.1:{ports['agents']}/agent/v1"],
        "node_id": "gpu-check",
        "token": TOKEN,
        "data_dir": str(root / "node"),
    }
    (root / "control.toml").write_text(tomli_w.dumps(control))
    (root / "node.toml").write_text(tomli_w.dumps(node))
    (root / "node.toml").chmod(0o600)
    return root / "control.toml", root / "node.toml"


def run_check(args: argparse.Namespace, root: Path) -> list[tuple[str, str]]:
    began = time.monotonic()
    facts: list[tuple[str, str]] = []
    if args.backend == "cuda":
        gpu = nvidia_gpu()
        facts += [("GPU", f"{gpu['name']} ({gpu['memory']}, compute {gpu['compute_cap']})"), ("driver", gpu["driver"])]
    archive = gpu_archive(args.backend, args.archive or os.environ.get("LLMGW_CUDA_ARCHIVE", ""))
    facts.append(("engine build", archive.name))
    model = Path(os.environ["LLMGW_TINY_MODEL"]) if os.environ.get("LLMGW_TINY_MODEL") else _tiny_model()
    ports = {"api": free_port(), "admin": free_port(), "agents": free_port()}
    control_toml, node_toml = write_configs(root, archive, model, ports)
    api, admin = f"http://127.0.0.1:{ports['api']}", f"http://127.0.0.1:{ports['admin']}/api/v1"
    logs = {name: open(root / f"{name}.log", "ab") for name in ("control", "node")}  # noqa: SIM115
    control = subprocess.Popen(
        [*daemon("llmgw-control"), "run", "--config", str(control_toml)],
        stdout=logs["control"],
        stderr=subprocess.STDOUT,
        process_group=0,
    )
    node = None
    try:
        wait_healthy(api, control, "llmgw-control")
        node = subprocess.Popen(
            [*daemon("llmgw-node"), "run", "--config", str(node_toml), "--stop-engines"],
            stdout=logs["node"],
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        say("control and node are up; placing the tiny model on the GPU (install, prove, offload)")
        started = time.monotonic()
        post(
            api + "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        facts.append(("cold start via gateway", f"{time.monotonic() - started:.1f} s (install, proof, load)"))
        binary = _prove_on_gpu(args, admin, root, facts)
        rows = _measure(args, api, binary, model, root)
        facts.append(("whole check", f"{time.monotonic() - began:.0f} s"))
        print_table(args, facts, rows)
        return facts
    finally:
        if node is not None:
            stop(node)
        stop(control)
        for handle in logs.values():
            handle.close()


def _prove_on_gpu(args: argparse.Namespace, admin: str, root: Path, facts: list[tuple[str, str]]) -> Path:
    """What the node installed, proved and offloaded, added to ``facts``; the engine binary it runs."""
    (node_view,) = get(admin + "/nodes")["nodes"]
    (engine,) = node_view["engines"]
    provenance = engine.get("provenance") or {}
    if provenance.get("backend") != args.backend:
        raise CheckFailed(
            f"the node installed a {provenance.get('backend')!r} build, not {args.backend}: "
            f"{engine['state']}; degraded: {node_view['facts'].get('degraded')}"
        )
    facts.append(
        (
            "node facts",
            f"{len(node_view['facts']['gpus'])} GPU(s) via {node_view['facts']['gpu_backend']}"
            f"; {engine['state']}, {provenance.get('backend')} build, proven with "
            "--list-devices",
        )
    )
    (model_view,) = get(admin + "/models")["models"]
    (replica,) = model_view["replicas"]
    lines = get(f"{admin}/replicas/{replica['id']}/logs?lines=1000")["lines"]
    offloaded = [line for line in lines if "offloaded" in line and "layers to GPU" in line]
    if not offloaded:
        raise CheckFailed("the replica's log has no 'offloaded N/M layers to GPU' line")
    facts.append(("offload (load log)", offloaded[-1].split(":", 1)[-1].strip()))
    used = replica.get("used") or {}
    facts.append(
        (
            "replica memory (node)",
            f"{used.get('vram_mib', 0)} MiB VRAM, {used.get('ram_mib', 0)} MiB RAM" if used else "not measured yet",
        )
    )
    if args.backend == "cuda" and not used.get("vram_mib"):
        say("warning: the node has not reported GPU memory for the engine's PID (yet)")
    binary = next((root / "node" / "engines" / "llama.cpp").glob("*/*/llama-server"))
    listing = subprocess.run(
        [str(binary), "--list-devices"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(binary.parent),
        env={**os.environ, **visible(args.backend)},
    )
    devices = [line.strip() for line in listing.stdout.splitlines() if line.startswith("  ")]
    facts.append(("--list-devices", "; ".join(devices) or "(none)"))
    return binary


def _measure(
    args: argparse.Namespace, api: str, binary: Path, model: Path, root: Path
) -> list[tuple[str, float, float]]:
    """Tokens/s through the gateway, the engine directly on the GPU, and on the CPU."""
    say(f"measuring: {args.rounds} x {args.tokens} tokens through the gateway, the engine directly, the CPU")
    gateway, gateway_engine = tokens_per_second(api, "tiny", args.tokens, args.rounds)
    rows = [("GPU, through the gateway", gateway, gateway_engine)]
    common = ["-c", "1024", "-np", "1", "-t", THREADS]
    for label, extra, env in (
        ("GPU, engine directly", ["--n-gpu-layers", "999"], visible(args.backend)),
        ("CPU, engine directly (--device none)", ["--device", "none", "--n-gpu-layers", "0"], {}),
    ):
        proc, url = start_direct(binary, model, [*common, *extra], root / "direct.log", env)
        try:
            wall, own = tokens_per_second(url, "tiny", args.tokens, args.rounds)
        finally:
            stop(proc, 10)
        rows.append((label, wall, own))
    return rows


def _tiny_model() -> Path:
    from llmgw_dev import tiny_model  # numpy and gguf: dev tools, absent from an offline pack

    return tiny_model.ensure_model()


def daemon(name: str) -> list[str]:
    """The daemon's command: its script in the environment, or its module where the environment was
    made offline from wheels (``gpu_pack``: the project's sources on the path, no scripts)."""
    if (BIN / name).exists():
        return [str(BIN / name)]
    module = name.replace("-", "_")
    return [sys.executable, "-c", f"import sys; from {module}.cli import main; sys.exit(main())"]


def visible(backend: str) -> dict[str, str]:
    # GPU 0, as placement chose it: a software Vulkan device is used only when named.
    return {"cuda": {"CUDA_VISIBLE_DEVICES": "0"}, "vulkan": {"GGML_VK_VISIBLE_DEVICES": "0"}}.get(backend, {})


def print_table(args: argparse.Namespace, facts: list[tuple[str, str]], rows: list[tuple[str, float, float]]) -> None:
    width = max(len(k) for k, _ in facts)
    print(
        f"\nllmgw gpu-check ({args.backend}; tiny model: 2 layers, {args.tokens} generated tokens, "
        f"median of {args.rounds})"
    )
    for key, value in facts:
        print(f"  {key:<{width}}  {value}")
    print(f"\n| {'run':<38} | {'tokens/s (wall clock)':>21} | {'tokens/s (engine)':>17} |")
    print(f"|{'-' * 40}|{'-' * 23}|{'-' * 19}|")
    for label, wall, own in rows:
        print(f"| {label:<38} | {wall:>21.0f} | {own:>17.0f} |")
    gateway, gpu, cpu = rows[0][1], rows[1][1], rows[2][1]
    print(f"\n  GPU vs CPU (direct): {gpu / cpu:.2f}x    gateway vs direct (GPU): {gateway / gpu:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["cuda", "vulkan"], default="cuda")
    parser.add_argument("--archive", default="", help="a CUDA (or Vulkan) llama.cpp release archive to use")
    parser.add_argument("--tokens", type=int, default=256, help="tokens generated per request (default 256)")
    parser.add_argument("--rounds", type=int, default=3, help="requests per measurement (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs) afterwards")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="llmgw-gpu-check-"))
    try:
        run_check(args, root)
    except (CheckFailed, OSError, subprocess.SubprocessError, ValueError, KeyError, StopIteration, SystemExit) as exc:
        # The logs stay for the reader of the failure.
        print(f"[gpu-check] FAILED: {type(exc).__name__}: {exc} (logs in {root})", file=sys.stderr)
        return 1
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
