"""The control plane at fleet scale: a reconcile pass over 1,000 nodes and 500 models, and
1,000 simulated nodes holding real WebSockets to a running control daemon.

    .venv/bin/python bench/fleet.py            # about a minute
    .venv/bin/python bench/fleet.py --quick    # fewer nodes, shorter

1. The reconcile pass, in process: 1,000 nodes that report an installed engine and 500 models
   with requests waiting, so the first pass places 500 replicas and later passes find nothing to
   do; reported as milliseconds per pass (first, and the steady state).
2. The simulated fleet: ``llmgw-control run`` as a subprocess; this process opens 1,000 agent
   WebSockets (hello with host facts, then heartbeats at the configured interval, answering
   nothing else) and meanwhile asks ``GET /v1/models`` ten times a second. Reported: control's
   CPU (utime+stime from /proc) over the steady window, as a share of one core, and the
   p50/p99 latency of /v1/models.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import httpx2
import tomli_w
import trio
from trio_websocket import open_websocket_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from llmgw_control.catalog import Catalog, Claim, EngineConfig, ModelConfig, ProfileConfig, WeightsConfig  # noqa: E402
from llmgw_control.fleet.agents import token_digest  # noqa: E402
from llmgw_control.fleet.inventory import Inventory, Liveness, NodeRecord  # noqa: E402
from llmgw_control.fleet.reconciler import Reconciler  # noqa: E402
from llmgw_control.gateway.replicas import ReplicaSet  # noqa: E402
from llmgw_dev.engine_proc import free_port  # noqa: E402
from llmgw_shared.facts import unprobed  # noqa: E402
from llmgw_shared.wire import PROTOCOL_VERSION, Command, EngineState, Heartbeat, Hello, encode  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
_SAMPLER = """
import json, sys, time, urllib.request
url, seconds = sys.argv[1], float(sys.argv[2])
out, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        response.read()
    out.append((time.perf_counter() - started) * 1000)
    time.sleep(0.1)
print(json.dumps(out))
"""
SHA = "0" * 64


class CountingDispatcher:
    def __init__(self) -> None:
        self.sent = 0

    def send(self, node_id: str, command: Command) -> bool:
        self.sent += 1
        return True


def models(count: int) -> list[ModelConfig]:
    return [
        ModelConfig(
            f"model-{i}", [ProfileConfig("cpu", WeightsConfig(f"http://files/m{i}.gguf", SHA, 10**9), max_replicas=1)]
        )
        for i in range(count)
    ]


def reconcile_pass(nodes: int, model_count: int, passes: int) -> dict[str, float]:
    catalog = Catalog(models(model_count), [EngineConfig()])
    inventory = Inventory()
    facts = attrs.evolve(unprobed(), probed=True, ram_total_mib=256_000)
    engine = EngineState("llama.cpp", "b11312", "installed")
    for i in range(nodes):
        node = NodeRecord(f"node-{i:04d}", f"10.0.{i // 250}.{i % 250}", facts, last_seen=0.0)
        node.update_engines([engine])
        inventory.put(node)
    dispatcher = CountingDispatcher()
    claims = {r.profile_key: Claim(2_000) for r in catalog.all_profiles()}
    reconciler = Reconciler(
        catalog,
        inventory,
        Liveness(15, 60),
        dispatcher,
        ReplicaSet(),
        secret=b"k" * 32,
        claims=claims,
        clock=lambda: 1.0,
    )
    for resolved in catalog.all_profiles():
        reconciler.demand.queued(resolved.profile_key, 1)
    timings = []
    for _ in range(passes):
        started = time.perf_counter()
        reconciler.reconcile_once()
        timings.append((time.perf_counter() - started) * 1000)
    steady = sorted(timings[1:])
    return {
        "nodes": nodes,
        "models": model_count,
        "placed": dispatcher.sent,
        "first_pass_ms": timings[0],
        "steady_pass_ms_p50": steady[len(steady) // 2],
        "steady_pass_ms_max": steady[-1],
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# The simulated nodes join as a production fleet's would: with a shared join token control knows.
JOIN_TOKEN = "llmgw-join-fleet-bench"


class Joined:
    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.all = trio.Event()

    def one(self) -> None:
        self.count += 1
        if self.count >= self.expected:
            self.all.set()


async def simulated_node(url: str, index: int, interval: float, stop: trio.Event, connected: Joined) -> None:
    facts = attrs.evolve(
        unprobed(),
        probed=True,
        hostname=f"sim-{index}",
        ram_total_mib=64_000,
        cores=16,
        arch="x86_64",
        cpu_features=["avx", "avx2", "fma", "f16c"],
    )
    hello = Hello(
        PROTOCOL_VERSION, f"sim-{index:04d}", JOIN_TOKEN, facts, [EngineState("llama.cpp", "b11312", "installed")], []
    )
    async with open_websocket_url(url, message_queue_size=64) as ws:
        await ws.send_message(encode(hello))
        await ws.get_message()  # welcome
        connected.one()

        async def drain() -> None:
            while True:
                await ws.get_message()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            seq = 0
            # Spread the heartbeats so 1,000 nodes do not beat in lockstep.
            await trio.sleep(interval * (index % 100) / 100)
            while not stop.is_set():
                seq += 1
                await ws.send_message(encode(Heartbeat(seq)))
                with trio.move_on_after(interval):
                    await stop.wait()
            nursery.cancel_scope.cancel()


async def simulated_fleet(nodes: int, seconds: float, model_count: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="llmgw-fleet-bench-"))
    api, admin, agents = free_port(), free_port(), free_port()
    interval = 5.0
    config = {
        "listen": f"127.0.0.1:{api}",
        "admin_listen": f"127.0.0.1:{admin}",
        "data_dir": str(root),
        "log_level": "warning",
        "agents": {
            "listen": f"127.0.0.1:{agents}",
            "heartbeat_interval": interval,
            "unreachable_after": 15.0,
            "lost_after": 60.0,
            "join_token_digests": [token_digest(JOIN_TOKEN)],
        },
        "models": [
            {
                "name": m.name,
                "profiles": [
                    {
                        "name": "cpu",
                        "weights": {"url": "http://files/x.gguf", "sha256": SHA, "size": 10**9},
                        "ram_mib": 2000,
                    }
                ],
            }
            for m in models(model_count)
        ],
    }
    path = root / "control.toml"
    path.write_text(tomli_w.dumps(config))
    log = (root / "control.log").open("wb")
    process = await trio.lowlevel.open_process(
        [str(Path(sys.executable).with_name("llmgw-control")), "run", "--config", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"ws://127.0.0.1:{agents}/agent/v1"
    latencies: list[float] = []
    stop = trio.Event()
    connected = Joined(nodes)
    try:
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{api}", timeout=30) as client:
            with trio.fail_after(30):
                while True:
                    try:
                        if (await client.get("/healthz")).status_code == 200:
                            break
                    except httpx2.TransportError:
                        await trio.sleep(0.1)
            async with trio.open_nursery() as nursery:
                for index in range(nodes):
                    nursery.start_soon(simulated_node, url, index, interval, stop, connected)
                    if index % 50 == 49:
                        await trio.sleep(0.05)  # a fleet connects over seconds, not in one instant
                with trio.fail_after(120):
                    await connected.all.wait()
                joined_at = time.monotonic()
                cpu_before = cpu_seconds(process.pid)
                # The sampler is its own process: this one is busy being 1,000 nodes, and its
                # event loop's delays would be measured as control's.
                sampler = await trio.run_process(
                    [sys.executable, "-c", _SAMPLER, f"http://127.0.0.1:{api}/v1/models", str(seconds)],
                    capture_stdout=True,
                )
                latencies = json.loads(sampler.stdout)
                cpu = cpu_seconds(process.pid) - cpu_before
                window = time.monotonic() - joined_at
                stop.set()
    finally:
        process.terminate()
        with trio.move_on_after(30):
            await process.wait()
        log.close()
    latencies.sort()
    return {
        "nodes": nodes,
        "models": model_count,
        "window_s": round(window, 1),
        "control_cpu_share_of_one_core": round(cpu / window, 3),
        "models_p50_ms": round(latencies[len(latencies) // 2], 2),
        "models_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 2),
        "samples": len(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    nodes, model_count = (200, 100) if args.quick else (1000, 500)
    print(
        f"# llmgw fleet bench: {nodes} nodes, {model_count} models "
        f"({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores)"
    )
    result = {"reconcile": reconcile_pass(nodes, model_count, passes=20)}
    print("reconcile pass:", json.dumps(result["reconcile"]))
    result["fleet"] = trio.run(simulated_fleet, nodes, 10.0 if args.quick else 30.0, model_count)
    print("simulated fleet:", json.dumps(result["fleet"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
