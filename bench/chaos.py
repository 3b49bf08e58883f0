"""The fleet broken on purpose, under load: what clients see, and how long until it is whole again.

One control, three node daemons and the real llama-server on the tiny model (as the system
tests run them: tests/support/fleet.py), with clients sending chat completions through the
official ``openai`` client (no retries: every failure counts). Each scenario starts from a
whole fleet (every node ready, ``tiny`` at its 2 ready replicas), injects one fault, and
reports the requests made and failed (by kind), the slowest request, and the time from the
fault to a converged fleet (the replicas back where they should be and a request served).

    .venv/bin/python bench/chaos.py                 # every scenario, about 6 minutes
    .venv/bin/python bench/chaos.py --only engine,control --json out.json

Scenarios: kill -9 an engine; kill -9 a node daemon (its engines live on); kill -9 a node and
its engines, restarted before lost_after; SIGSTOP a node (daemon and engines: a hung machine)
past unreachable_after, then SIGCONT; saturate the model with 16 concurrent streams; kill -9
control under load and restart it; lose 2 of 3 nodes (kill -9, engines too) for good.
Every process is started by this script and stopped by PID (the daemons' own, the engines'
found by command line under this run's directory).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import httpx2
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))

from support.fleet import Fleet, kill_pids, model_entry, running_fleet  # noqa: E402

MODEL = "tiny"
MIN_REPLICAS = 2
# Node timings short enough for a bench, with room for a node restart (1-2 s) before lost_after.
AGENTS = {"heartbeat_interval": 0.5, "unreachable_after": 2.0, "lost_after": 8.0}
CONVERGE_LIMIT = 90.0


@attrs.define
class Load:
    """Clients in threads (the openai client is synchronous), each sending requests back to back."""

    api_url: str
    clients: int = 4
    stream: bool = False
    max_tokens: int = 8
    outcomes: list[tuple[float, float, str]] = attrs.Factory(list)  # (start, seconds, "ok" | error kind)
    _stop: threading.Event = attrs.Factory(threading.Event)
    _lock: threading.Lock = attrs.Factory(threading.Lock)

    def _one_client(self) -> None:
        import openai

        client = openai.OpenAI(base_url=self.api_url + "/v1", api_key="none", max_retries=0, timeout=60)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if self.stream:
                    chunks = client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": "hi"}],
                        max_tokens=self.max_tokens,
                        stream=True,
                    )
                    for _ in chunks:
                        pass
                else:
                    client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=self.max_tokens
                    )
                kind = "ok"
            except openai.APIStatusError as exc:
                kind = f"HTTP {exc.status_code}"
            except openai.APIConnectionError as exc:
                kind = f"connection: {type(exc.__cause__ or exc).__name__}"
            except Exception as exc:  # a stream cut mid-way, and anything else a client would see
                kind = type(exc).__name__
            with self._lock:
                self.outcomes.append((started, time.monotonic() - started, kind))
            if kind != "ok":
                time.sleep(0.05)  # a failing client does not spin

    async def run(self) -> None:
        """Until cancelled; the threads finish their request in flight, then stop."""
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.clients):
                    nursery.start_soon(lambda: trio.to_thread.run_sync(self._one_client, abandon_on_cancel=True))
                await trio.sleep_forever()
        finally:
            self._stop.set()

    def since(self, t0: float) -> list[tuple[float, float, str]]:
        with self._lock:
            return [o for o in self.outcomes if o[0] + o[1] >= t0]


async def admin(fleet: Fleet, path: str) -> Any:
    async with httpx2.AsyncClient(base_url=fleet.admin_url, timeout=10) as client:
        return (await client.get(path)).json()


async def probe(fleet: Fleet) -> bool:
    try:
        async with httpx2.AsyncClient(base_url=fleet.api_url, timeout=30) as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
        return response.status_code == 200
    except httpx2.HTTPError:
        return False


async def ready_replicas(fleet: Fleet) -> list[dict[str, Any]]:
    nodes, models = await fleet.state()
    up = {n["id"] for n in nodes if n["state"] == "ready"}
    replicas = next(m for m in models if m["model"] == MODEL)["replicas"]
    return [r for r in replicas if r["state"] == "ready" and r["node"] in up]


async def whole(fleet: Fleet, nodes: set[str] | None = None, replicas: int = MIN_REPLICAS) -> bool:
    """Every wanted node ready, the model at its replicas, and a request served."""
    try:
        listed, _ = await fleet.state()
        up = {n["id"] for n in listed if n["state"] == "ready"}
        if not (nodes or set(fleet.nodes)) <= up or len(await ready_replicas(fleet)) < replicas:
            return False
    except httpx2.HTTPError:
        return False
    return await probe(fleet)


async def wait_until(check: Callable[[], Awaitable[bool]], limit: float = CONVERGE_LIMIT, poll: float = 0.1) -> float:
    """Seconds until ``check`` holds (raises TooSlowError past ``limit``)."""
    started = time.monotonic()
    with trio.fail_after(limit):
        while not await check():  # noqa: ASYNC110 -- polling the daemons over HTTP is the point
            await trio.sleep(poll)
    return time.monotonic() - started


def engine_of(fleet: Fleet, node_id: str, port: int) -> int | None:
    for pid in fleet.engine_pids(node_id):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--port" in cmdline and cmdline[cmdline.index(b"--port") + 1] == str(port).encode():
            return pid
    return None


@attrs.define
class Result:
    name: str
    requests: int = 0
    errors: dict[str, int] = attrs.Factory(dict)
    slowest_s: float = 0.0
    converged_s: float | None = None
    notes: list[str] = attrs.Factory(list)


async def scenario(
    fleet: Fleet,
    name: str,
    fault: Callable[[Fleet, Result], Awaitable[float]],
    *,
    clients: int = 4,
    stream: bool = False,
    settle_s: float = 2.0,
) -> Result:
    """Whole fleet, load on, ``fault`` (returns its t0 and waits until converged), load for
    ``settle_s`` more; the figures are over the requests that ended after t0."""
    result = Result(name)
    await wait_until(lambda: whole(fleet), limit=120)
    load = Load(fleet.api_url, clients=clients, stream=stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(load.run)
        await trio.sleep(2.0)  # steady traffic before the fault
        t0 = await fault(fleet, result)
        await trio.sleep(settle_s)
        nursery.cancel_scope.cancel()
    outcomes = load.since(t0)
    result.requests = len(outcomes)
    result.errors = dict(Counter(kind for _, _, kind in outcomes if kind != "ok"))
    result.slowest_s = round(max((seconds for _, seconds, _ in outcomes), default=0.0), 2)
    return result


async def converge(fleet: Fleet, result: Result, t0: float, **expect: Any) -> float:
    try:
        await wait_until(lambda: whole(fleet, **expect))
        result.converged_s = round(time.monotonic() - t0, 2)
    except trio.TooSlowError:
        result.notes.append(f"did not converge within {CONVERGE_LIMIT:g} s")
    return t0


async def victim(fleet: Fleet) -> dict[str, Any]:
    """A ready replica (its node holds one, so the fault matters)."""
    return sorted(await ready_replicas(fleet), key=lambda r: r["node"])[0]


# --------------------------------------------------------------------------- the faults


async def kill_engine(fleet: Fleet, result: Result) -> float:
    replica = await victim(fleet)
    pid = engine_of(fleet, replica["node"], replica["port"])
    assert pid is not None
    kill_pids([pid])
    t0 = time.monotonic()

    async def withdrawn() -> bool:
        listed = {r["id"]: r for r in (await admin(fleet, "/api/v1/replicas"))["replicas"]}
        return not listed.get(replica["id"], {}).get("routable", False)

    with trio.move_on_after(10):
        result.notes.append(f"withdrawn after {await wait_until(withdrawn, poll=0.02):.2f} s")
    return await converge(fleet, result, t0)


async def kill_node_daemon(fleet: Fleet, result: Result) -> float:
    replica = await victim(fleet)
    engines = fleet.engine_pids()
    await fleet.nodes[replica["node"]].stop(signal.SIGKILL)
    t0 = time.monotonic()
    await fleet.nodes[replica["node"]].start()  # as systemd would
    await converge(fleet, result, t0)
    result.notes.append(
        "engines adopted, none restarted"
        if fleet.engine_pids() == engines
        else f"engines changed: {engines} -> {fleet.engine_pids()}"
    )
    return t0


async def kill_node_and_engines(fleet: Fleet, result: Result) -> float:
    replica = await victim(fleet)
    await fleet.nodes[replica["node"]].stop(signal.SIGKILL)
    fleet.kill_engines(replica["node"])
    t0 = time.monotonic()
    await fleet.nodes[replica["node"]].start()  # back well before lost_after

    async def replaced() -> bool:
        ids = {r["id"] for r in await ready_replicas(fleet)}
        return replica["id"] not in ids and await whole(fleet)

    try:
        await wait_until(replaced)
        result.converged_s = round(time.monotonic() - t0, 2)
    except trio.TooSlowError:
        result.notes.append(f"the dead replica was still listed after {CONVERGE_LIMIT:g} s")
    return t0


async def stop_node(fleet: Fleet, result: Result) -> float:
    replica = await victim(fleet)
    node = fleet.nodes[replica["node"]]
    engines = fleet.engine_pids(replica["node"])
    node.send_signal(signal.SIGSTOP)
    for pid in engines:
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        await trio.sleep(float(AGENTS["unreachable_after"]) + 2)
        routable = {r["id"]: r["routable"] for r in (await admin(fleet, "/api/v1/replicas"))["replicas"]}
        result.notes.append(
            "withdrawn while stopped" if not routable.get(replica["id"]) else "STILL PUBLISHED while stopped"
        )
    finally:
        for pid in engines:
            os.kill(pid, signal.SIGCONT)
        node.send_signal(signal.SIGCONT)
    return await converge(fleet, result, t0)


async def steady(fleet: Fleet, result: Result) -> float:
    """No fault at all: what clients see of a whole fleet (the keep-alive race showed here, issue 28)."""
    t0 = time.monotonic()
    await trio.sleep(30)
    return t0


async def saturate(fleet: Fleet, result: Result) -> float:
    t0 = time.monotonic()
    before = len(await ready_replicas(fleet))
    await trio.sleep(20)
    after = len(await ready_replicas(fleet))
    result.notes.append(f"ready replicas {before} -> {after} under 16 streams (max_replicas 3)")
    return t0


async def kill_control(fleet: Fleet, result: Result) -> float:
    engines = fleet.engine_pids()
    await fleet.control.stop(signal.SIGKILL)
    t0 = time.monotonic()
    await fleet.start_control()  # restarted at once, as systemd would; returns once /healthz is 200
    up = time.monotonic()
    result.notes.append(f"control healthy {up - t0:.2f} s after the kill")
    served = await wait_until(lambda: probe(fleet), poll=0.05)
    result.notes.append(f"a request sent then served {served:.2f} s after control was healthy")
    await converge(fleet, result, t0)
    result.notes.append(
        "engines adopted, none restarted"
        if fleet.engine_pids() == engines
        else f"engines changed: {engines} -> {fleet.engine_pids()}"
    )
    return t0


async def lose_two_nodes(fleet: Fleet, result: Result) -> float:
    survivor = sorted(fleet.nodes)[0]
    lost = [n for n in sorted(fleet.nodes) if n != survivor]
    for node_id in lost:
        await fleet.nodes[node_id].stop(signal.SIGKILL)
        fleet.kill_engines(node_id)
    t0 = time.monotonic()
    await converge(fleet, result, t0, nodes={survivor})
    result.notes.append(
        f"replicas all on {survivor}"
        if all(r["node"] == survivor for r in await ready_replicas(fleet))
        else "replicas not all on the survivor"
    )
    return t0


async def bring_back(fleet: Fleet) -> None:
    """Restart node daemons that are not running (after lose_two_nodes)."""
    for daemon in fleet.nodes.values():
        if daemon.process is not None and daemon.process.returncode is not None:
            await daemon.start()


SCENARIOS: dict[str, tuple[str, Callable[[Fleet, Result], Awaitable[float]], dict[str, Any]]] = {
    "steady": ("no fault, 30 s", steady, {}),
    "steady-stream": ("no fault, 30 s of streams", steady, {"stream": True}),
    "engine": ("kill -9 an engine", kill_engine, {}),
    "node": ("kill -9 a node daemon (engines live on)", kill_node_daemon, {}),
    "node+engines": ("kill -9 a node and its engines, restarted", kill_node_and_engines, {}),
    "sigstop": ("SIGSTOP a node past unreachable_after", stop_node, {}),
    "saturate": ("saturate the model (16 streams)", saturate, {"clients": 16, "stream": True}),
    "control": ("kill -9 control under load, restarted", kill_control, {}),
    "lose2": ("lose 2 of 3 nodes", lose_two_nodes, {}),
}


async def main(args: argparse.Namespace) -> list[Result]:
    from llmgw_dev.build_engine import ensure_engine
    from llmgw_dev.tiny_model import ensure_model

    chosen = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenario(s) {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-chaos-") as tmp:
        root = Path(args.workdir) if args.workdir else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        tiny_model = ensure_model()
        # The config's model is never asked for; the measured one is added once every node has
        # joined, so its replicas spread over the nodes (placed at start, all would land on n1).
        async with running_fleet(root, tiny_model, ensure_engine(), models=[("unused", {})], agents=AGENTS) as fleet:
            for node_id in ("n1", "n2", "n3"):
                await fleet.add_node(node_id)
            async with httpx2.AsyncClient(base_url=fleet.admin_url, timeout=10) as client:
                entry = model_entry(MODEL, tiny_model, fleet.agent_url, min_replicas=MIN_REPLICAS, max_replicas=3)
                (await client.post("/api/v1/models", json=entry)).raise_for_status()
            for key in chosen:
                title, fault, load = SCENARIOS[key]
                started = time.monotonic()
                result = await scenario(fleet, title, fault, **load)
                results.append(result)
                converged = f"in {result.converged_s:.2f} s" if result.converged_s is not None else "-"
                print(
                    f"{title:45} {result.requests:5d} requests, errors {result.errors or 'none'}, "
                    f"slowest {result.slowest_s:.2f} s, converged {converged}"
                    f" ({time.monotonic() - started:.0f} s); {'; '.join(result.notes)}",
                    flush=True,
                )
                await bring_back(fleet)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated scenarios ({', '.join(SCENARIOS)})")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--workdir", help="keep the daemons' logs here (default: a temporary directory)")
    arguments = parser.parse_args()
    print(
        f"# llmgw chaos bench ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores): one control, "
        f"three nodes, real llama-server, '{MODEL}' min {MIN_REPLICAS} replicas",
        flush=True,
    )
    began = time.monotonic()
    figures = trio.run(main, arguments)
    print(f"# total {time.monotonic() - began:.0f} s", flush=True)
    if arguments.json:
        Path(arguments.json).write_text(json.dumps([attrs.asdict(r) for r in figures], indent=2) + "\n")
