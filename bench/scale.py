"""How the gateway scales: ``workers = N`` against one worker, N daemons against one, in one run.

    .venv/bin/python bench/run.py --workers 2 --quick
    .venv/bin/python bench/run.py --daemons 2 --quick      # on a throwaway PostgreSQL

Both compare two set-ups over the same load from the same load generator, minutes apart at most:
- ``--workers N``: one ``llmgw-control run`` with ``workers = 1``, then one with ``workers = N``
  (a supervisor and N worker processes sharing the client port), on a SQLite store;
- ``--daemons N``: one control daemon, then N, each ``workers = 1``, all on one PostgreSQL
  (``llmgw_dev.postgres``, a fresh database per set-up); the load generator spreads its
  connections over the daemons' client ports.

Static endpoints to the fake engine (as ``bench/run.py``), and a client key whose group has a
quota far from its limits, so every request is admitted through quota slices (tenancy/slices.py).
Nothing is pinned: scaling over the cores is what is measured, and on a 2-core machine the load
generator and the fake engine share them with the gateway (docs/performance.md says what that
means for the ratio).

Reported per set-up, mode and concurrency: requests/s (for streams also chunks/s), CPU per request
summed over the whole process tree (supervisor and workers, ``/proc/<pid>/stat``), and store
transactions per 1,000 requests from every process's ``llmgw_store_transactions_total``: the total
during the load, and the part attributable to requests once the background rate (the lease, the
polls), measured over an idle period as long as the load, is taken off.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from run import (
    MODEL,
    ROOT,
    STREAM_CHUNKS,
    LoadResult,
    _cpu_model,
    _revision,
    _stop,
    fake_engine_process,
    free_port,
    run_load,
)

sys.path.insert(0, str(ROOT / "tools"))
from llmgw_dev.postgres import PostgresServer

CLK_TCK = os.sysconf("SC_CLK_TCK")
# Far from anything the bench reaches (a few thousand requests a minute), so no request is
# refused, yet set, so every admission goes through the quota-slice book.
BENCH_QUOTA = {"requests_per_minute": 10_000_000, "tokens_per_minute": 1_000_000_000}
TRANSACTIONS = "llmgw_store_transactions_total"


# --------------------------------------------------------------------------- CPU of a process tree


def parse_stat(text: str) -> tuple[int, int]:
    """(parent pid, utime + stime in clock ticks) from the text of ``/proc/<pid>/stat``.

    The name (field 2) is in parentheses and may itself hold spaces and ')': split after the last.
    """
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def tree_cpu_seconds(root: int, proc: Path = Path("/proc")) -> float:
    """utime + stime of ``root`` and all its descendants (a supervisor and its workers)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid, used = parse_stat((entry / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
        parents[int(entry.name)], ticks[int(entry.name)] = ppid, used
    members, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in members:
                members.add(pid)
                frontier.append(pid)
    return sum(ticks.get(pid, 0) for pid in members) / CLK_TCK


# --------------------------------------------------------------------------- the gateways


@attrs.define
class Gateway:
    url: str
    pid: int
    admin_urls: list[str]  # one per process that counts transactions (each worker has its own)


def _free_port_run(length: int) -> int:
    """A port with the ``length - 1`` ports after it free too (worker I's admin is port + I)."""
    for _ in range(50):
        base = free_port()
        try:
            for offset in range(1, length):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports found")


@contextmanager
def gateway(
    command: Sequence[str], engine_url: str, tmp: Path, name: str, *, workers: int, store: str
) -> Iterator[Gateway]:
    port, admin = free_port(), _free_port_run(workers)
    config = tmp / f"{name}.toml"
    config.write_text(f"workers = {workers}\n" + (f"store = {json.dumps(store)}\n" if store else ""))
    cmd = [
        *command,
        "run",
        "--config",
        str(config),
        "--listen",
        f"127.0.0.1:{port}",
        "--admin-listen",
        f"127.0.0.1:{admin}",
        "--endpoint",
        f"e1={engine_url}={MODEL}",
        "--data-dir",
        str(tmp / name),
    ]
    log_path = tmp / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    admins = [f"http://127.0.0.1:{admin + i}" for i in range(workers)]
    try:
        deadline = time.monotonic() + 60

        def ready() -> bool:
            urls = [f"http://127.0.0.1:{port}/healthz", *(f"{a}/metrics" for a in admins)]
            return all(_get(url) is not None for url in urls)

        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").splitlines()[-20:]
                raise RuntimeError(f"{name} did not become ready:\n" + "\n".join(tail))
            time.sleep(0.1)
        yield Gateway(f"http://127.0.0.1:{port}", proc.pid, admins)
    finally:
        _stop(proc)


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            body: bytes = resp.read()
            return body if resp.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


def _call(method: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
        return answer


def client_key(admin_url: str) -> str:
    """A group with a quota far from its limits, and a key in it; returns the key's secret."""
    group = _call("POST", f"{admin_url}/api/v1/groups", {"name": "bench"})["group"]
    _call("PUT", f"{admin_url}/api/v1/groups/{group['id']}/quota", BENCH_QUOTA)
    secret: str = _call("POST", f"{admin_url}/api/v1/keys", {"name": "bench", "group_id": group["id"]})["secret"]
    return secret


def wait_key_served(urls: Sequence[str], key: str, count: int) -> None:
    """Until ``count`` requests in a row with ``key`` succeed on every URL (the key reached all)."""
    deadline = time.monotonic() + 30
    for url in urls:
        while True:
            done = trio.run(
                partial(run_load, url, stream=False, concurrency=1, requests=count, seconds=10, api_key=key)
            )
            if done.requests == count and not done.errors:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} does not serve the bench key")
            time.sleep(0.2)


def transactions(gateways: Sequence[Gateway]) -> float:
    """``llmgw_store_transactions_total`` summed over kinds and over every process."""
    total = 0.0
    for gw in gateways:
        for admin in gw.admin_urls:
            body = _get(f"{admin}/metrics")
            if body is None:
                raise RuntimeError(f"{admin}/metrics did not answer")
            for line in body.decode().splitlines():
                if line.startswith(TRANSACTIONS + "{"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


# --------------------------------------------------------------------------- measuring


@attrs.define
class Measure:
    setup: str
    mode: str
    concurrency: int
    result: LoadResult
    cpu_ms: float
    transactions: float

    @property
    def chunks_per_s(self) -> float:
        return self.result.rps * STREAM_CHUNKS if self.mode == "stream" else 0.0


@attrs.define
class Setup:
    name: str
    processes: int
    measures: list[Measure]
    idle_transactions_per_s: float


def measure_setup(
    name: str, processes: int, gateways: Sequence[Gateway], key: str, levels: Sequence[int], budget: tuple[int, float]
) -> Setup:
    urls = [gw.url for gw in gateways]
    measures: list[Measure] = []
    load_seconds = 0.0
    marks: dict[str, float] = {}

    def start() -> None:
        marks["cpu"] = sum(tree_cpu_seconds(gw.pid) for gw in gateways)
        marks["tx"] = transactions(gateways)

    for mode in ("non-stream", "stream"):
        for c in levels:
            result = trio.run(
                partial(
                    run_load,
                    urls,
                    stream=mode == "stream",
                    concurrency=c,
                    requests=budget[0],
                    seconds=budget[1],
                    api_key=key,
                    on_start=start,
                )
            )
            cpu = sum(tree_cpu_seconds(gw.pid) for gw in gateways) - marks["cpu"]
            tx = transactions(gateways) - marks["tx"]
            served = max(1, result.requests + result.errors)
            measures.append(Measure(name, mode, c, result, cpu * 1000 / served, tx))
            load_seconds += result.seconds
            print(fmt_measure(measures[-1], None), flush=True)
    # The background: what the same processes do to the store when nobody sends requests, over
    # as long as the load took (bounded: a long idle wait says nothing more).
    idle = min(load_seconds, 30.0)
    before = transactions(gateways)
    time.sleep(idle)
    idle_rate = (transactions(gateways) - before) / idle if idle else 0.0
    print(f"  {name}: idle {idle:.1f} s: {idle_rate:.2f} store transactions/s in the background")
    return Setup(name, processes, measures, idle_rate)


def per_thousand(m: Measure, idle_rate: float | None) -> tuple[float, float | None]:
    """(transactions per 1,000 requests, and with the idle rate taken off) during ``m``."""
    requests = max(1, m.result.requests)
    total = m.transactions * 1000 / requests
    if idle_rate is None:
        return total, None
    return total, max(0.0, m.transactions - idle_rate * m.result.seconds) * 1000 / requests


def fmt_measure(m: Measure, idle_rate: float | None) -> str:
    total, attributable = per_thousand(m, idle_rate)
    chunks = f"  {m.chunks_per_s:7.0f} chunks/s" if m.mode == "stream" else " " * 17
    line = (
        f"{m.setup:<10} {m.mode:<10} c={m.concurrency:<4} {m.result.rps:7.0f} req/s{chunks}  "
        f"cpu/req {m.cpu_ms:5.2f} ms  store tx/1000 req {total:6.1f}"
    )
    if attributable is not None:
        line += f" (attributable {attributable:6.1f})"
    return line + (f"  errors {m.result.errors}" if m.result.errors else "")


def run_scale(args: argparse.Namespace) -> int:
    many = args.daemons or args.workers
    if many < 2:
        raise SystemExit("--workers / --daemons: give 2 or more (the comparison is against 1)")
    if args.workers and args.daemons:
        raise SystemExit("--workers and --daemons: one at a time")
    levels: list[int] = args.concurrency or [32, 128]
    # Long enough that the store transactions of a measurement are tens, not one or two: the
    # slices renew on time and on use, so a sub-second window counts noise.
    budget = (4000, 4.0) if args.quick else (20000, 15.0)
    command = [str(args.gateway)]
    kind = "daemons" if args.daemons else "workers"
    print(
        f"llmgw scale bench ({kind})  {time.strftime('%Y-%m-%d %H:%M')}  {os.cpu_count()} cores  "
        f"{_cpu_model()}  python {sys.version.split()[0]}"
    )
    print(
        f"code: {_revision()}; nothing pinned: load generator, fake engine and gateway share the "
        f"{os.cpu_count()} cores; load average before {os.getloadavg()[0]:.2f}\n"
    )
    setups: list[Setup] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-scale-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        engine_url, _engine_pid = stack.enter_context(fake_engine_process(None))
        server = stack.enter_context(PostgresServer.start()) if args.daemons else None
        for count in (1, many):
            name = f"{count} {kind.rstrip('s') if count == 1 else kind}"
            with ExitStack() as running:
                if server is not None:
                    store = server.create_database(f"bench_{count}")
                    gws = [
                        running.enter_context(
                            gateway(command, engine_url, tmp, f"d{count}-{i}", workers=1, store=store)
                        )
                        for i in range(count)
                    ]
                else:
                    gws = [
                        running.enter_context(gateway(command, engine_url, tmp, f"w{count}", workers=count, store=""))
                    ]
                key = client_key(gws[0].admin_urls[0])
                # Enough requests per process that every worker behind the shared port has the key.
                wait_key_served([gw.url for gw in gws], key, count=4 * count)
                setups.append(measure_setup(name, count, gws, key, levels, budget))
    print(f"\nload average after the run {os.getloadavg()[0]:.2f}\n")
    one, more = setups
    print("summary (transactions: total during the load; attributable: less the idle background rate)")
    for setup in setups:
        for m in setup.measures:
            print("  " + fmt_measure(m, setup.idle_transactions_per_s))
    print(f"ratios, {more.name} / {one.name}:")
    for a, b in zip(one.measures, more.measures, strict=True):
        rps = b.result.rps / a.result.rps if a.result.rps else float("nan")
        cpu = b.cpu_ms / a.cpu_ms if a.cpu_ms else float("nan")
        print(f"  {a.mode:<10} c={a.concurrency:<4} req/s x{rps:4.2f}  cpu/req x{cpu:4.2f}")
    if args.json:
        args.json.write_text(json.dumps([_setup_json(s) for s in setups], indent=2))
    return 0


def _setup_json(setup: Setup) -> dict[str, Any]:
    rows = []
    for m in setup.measures:
        total, attributable = per_thousand(m, setup.idle_transactions_per_s)
        rows.append(
            {
                "mode": m.mode,
                "concurrency": m.concurrency,
                "requests": m.result.requests,
                "errors": m.result.errors,
                "seconds": round(m.result.seconds, 3),
                "rps": round(m.result.rps, 1),
                "chunks_per_s": round(m.chunks_per_s, 1),
                "p50_ms": round(m.result.pct(0.5), 3),
                "cpu_ms_per_request": round(m.cpu_ms, 3),
                "store_transactions": m.transactions,
                "store_transactions_per_1000": round(total, 2),
                "store_transactions_per_1000_attributable": round(attributable or 0.0, 2),
            }
        )
    return {
        "setup": setup.name,
        "processes": setup.processes,
        "idle_store_transactions_per_s": round(setup.idle_transactions_per_s, 3),
        "measures": rows,
    }
