"""Cold-start overhead: what llmgw adds when a request has to start its model first.

    .venv/bin/python bench/coldstart.py

Control and one node run as processes on this machine with the real llama-server and the tiny
model (the engine already installed, so only the model start is measured). For each of three
models (the same weights under three names, so each start is cold), a streamed chat request is
timed to its first content chunk. The engine's own start time is measured directly, in the
same run: llama-server started by hand on the same file with the same flags, until /health
answers. Overhead = cold time to first token - engine start - warm time to first token; it is
what the activator, the reconciler, the node's supervisor and health polling add together.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from llmgw_dev import build_engine  # noqa: E402
from llmgw_dev.demo import post_json, prepare, stop, wait_healthy  # noqa: E402
from llmgw_dev.engine_proc import free_port, llama_server_process  # noqa: E402
from llmgw_dev.tiny_model import ensure_model  # noqa: E402

BIN = Path(sys.executable).parent
MODELS = ["tiny-a", "tiny-b", "tiny-c"]


def stream_ttft(api: str, model: str) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    request = urllib.request.Request(
        api + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            if line.startswith(b"data: ") and b'"content"' in line and b'"content":null' not in line:
                first = time.perf_counter() - started
                response.read()
                return first
    raise RuntimeError("the stream carried no content")


def nodes_ready(admin: str) -> bool:
    try:
        with urllib.request.urlopen(admin + "/api/v1/nodes", timeout=5) as response:
            nodes = json.load(response)["nodes"]
    except (urllib.error.URLError, OSError):
        return False
    return any(e["state"].startswith("installed") for n in nodes for e in n["engines"])


def engine_start_seconds(binary: Path, model: Path, runs: int = 3) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        with llama_server_process(binary, model, alias="probe", extra_args=["-c", "1024", "-np", "2"]):
            times.append(time.perf_counter() - started)
    return times


def main() -> None:
    archive = build_engine.ensure_engine()
    model = ensure_model()
    root = Path(tempfile.mkdtemp(prefix="llmgw-coldstart-"))
    ports = {"api": free_port(), "admin": free_port(), "agents": free_port()}
    control_toml, node_toml = prepare(root, model, archive, ports)
    text = control_toml.read_text()
    # Three names for the same weights: three cold starts.
    entry = text[text.index("[[models]]") :]
    control_toml.write_text(
        text[: text.index("[[models]]")]
        + "".join(entry.replace('name = "tiny"', f'name = "{name}"', 1) for name in MODELS)
    )
    api, admin = f"http://127.0.0.1:{ports['api']}", f"http://127.0.0.1:{ports['admin']}"
    control = subprocess.Popen(
        [str(BIN / "llmgw-control"), "run", "--config", str(control_toml), "--log-level", "warning"]
    )
    node = subprocess.Popen(
        [str(BIN / "llmgw-node"), "run", "--config", str(node_toml), "--stop-engines"], stderr=subprocess.DEVNULL
    )
    try:
        wait_healthy(api, control, "llmgw-control")
        deadline = time.monotonic() + 120
        while not nodes_ready(admin):
            if time.monotonic() > deadline:
                raise SystemExit("the node did not install the engine in time")
            time.sleep(0.2)
        cold = [stream_ttft(api, name) for name in MODELS]
        warm = [stream_ttft(api, name) for name in MODELS for _ in range(3)]
        post_json(
            api + "/v1/chat/completions",
            {"model": MODELS[0], "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
        )
    finally:
        stop(node)
        stop(control)
    engine = engine_start_seconds(build_engine.server_binary(), model)
    shutil.rmtree(root, ignore_errors=True)
    cold_ms, warm_ms, engine_ms = (statistics.median(v) * 1000 for v in (cold, warm, engine))
    print(f"# llmgw cold start ({time.strftime('%Y-%m-%d %H:%M')}), tiny model, real llama-server")
    print(f"cold time to first token (median of {len(cold)}): {cold_ms:.0f} ms  {[round(c * 1000) for c in cold]}")
    print(f"warm time to first token (median of {len(warm)}): {warm_ms:.1f} ms")
    print(f"engine start alone, to /health 200 (median of {len(engine)}): {engine_ms:.0f} ms")
    print(f"cold-start overhead added by llmgw: {cold_ms - engine_ms - warm_ms:.0f} ms")


if __name__ == "__main__":
    main()
