"""Measure what llmgw-control adds on the data path: latency, throughput and CPU per request.

    .venv/bin/python bench/run.py            # full run, about 2-3 minutes
    .venv/bin/python bench/run.py --quick    # a short run, about 30 s
    .venv/bin/python bench/run.py --tracing  # the gateway traces every request (see below)

Method (docs/performance.md has the reasoning and the results):
- a fake engine (``llmgw_dev.fake_engine``, no model, answers at once) runs as a subprocess pinned
  to core 0, together with this process, the load generator;
- the gateway runs as a subprocess pinned to core 1 (``taskset -c 1``), proxying to the fake;
- for non-streaming and streaming (32 content chunks) requests at concurrency 1, 32 and 128, the
  load generator runs the same bounded load (a request count and a time cap) first directly
  against the fake engine, then through the gateway, and reports requests/s and p50/p99 latency of
  both, the ratios, and the gateway's CPU time per request from ``/proc/<pid>/stat``.

The load generator is trio with a minimal HTTP/1.1 reader on persistent connections: one
connection per concurrent worker, no pool. A heavier client (httpx2, even h11) would spend the
core that the fake engine needs, and the direct numbers would measure the client.

``--tracing`` gives the gateway a ``[tracing]`` section with ``sample_ratio = 1``: every request
makes its spans, and the SDK's OTLP/HTTP exporter sends them to a sink in this process that
answers each export with 200 (its count is printed at the end).

About 730 lines: one benchmark run end to end (the stack under test, the load, the figures), kept in
one file so a run can be read as it happens.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ROOT = Path(__file__).resolve().parent.parent
MODEL = "fake-model"
STREAM_CHUNKS = 32
CLK_TCK = os.sysconf("SC_CLK_TCK")

# The targets we hold the gateway to (see docs/performance.md).
TARGET_ADDED_P50_MS_C1 = 2.0
TARGET_CPU_MS_NONSTREAM = 2.5
TARGET_CPU_MS_STREAM = 7.0


@attrs.define
class LoadResult:
    requests: int
    errors: int
    seconds: float
    latencies: list[float]
    ttfb: list[float]

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def pct(self, q: float, values: list[float] | None = None) -> float:
        data = sorted(self.latencies if values is None else values)
        if not data:
            return float("nan")
        return data[min(len(data) - 1, int(q * len(data)))] * 1000.0


@attrs.define
class Budget:
    """A shared request budget with a wall-clock cap: every load loop is bounded in both."""

    remaining: int
    deadline: float

    def take(self) -> bool:
        if self.remaining <= 0 or time.monotonic() > self.deadline:
            return False
        self.remaining -= 1
        return True


class _Closed(Exception):
    pass


class _Reader:
    """A minimal HTTP/1.1 response reader over one connection.

    Hand-written instead of h11 because the load generator shares core 0 with the fake engine:
    h11 handles every chunk of a stream as an event through its state machine (~30% of the core's
    time in a profile), while a reader that only finds chunk boundaries with ``bytes.find`` is
    several times cheaper. It parses what it reads properly (status, Content-Length or chunked
    framing), so a truncated or malformed answer counts as an error, never as a success.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    async def _more(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise _Closed
        self.buf += data

    async def response(self, started: float, ttfb: list[float]) -> tuple[int, bytes, bool]:
        """(status, the last bytes of the body, whether the connection may be reused)."""
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            await self._more()
        ttfb.append(time.perf_counter() - started)
        lines = self.buf[:end].split(b"\r\n")
        self.buf = self.buf[end + 4 :]
        status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        reuse = headers.get(b"connection") != b"close"
        tail = b""
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            while True:
                while (eol := self.buf.find(b"\r\n")) < 0:
                    await self._more()
                size = int(self.buf[:eol].split(b";", 1)[0], 16)
                need = eol + 2 + size + 2
                while len(self.buf) < need:
                    await self._more()
                if size == 0:
                    self.buf = self.buf[need:]  # no trailers: none of our servers sends them
                    return status, tail, reuse
                tail = (tail + self.buf[eol + 2 : eol + 2 + size])[-256:]
                self.buf = self.buf[need:]
        if b"content-length" in headers:
            length = int(headers[b"content-length"])
            while len(self.buf) < length:
                await self._more()
            tail, self.buf = self.buf[:length][-256:], self.buf[length:]
            return status, tail, reuse
        while True:  # delimited by the end of the connection
            try:
                await self._more()
            except _Closed:
                return status, self.buf[-256:], False


class _Connection:
    """One client connection, reused for as long as the server allows (reopened when it closes)."""

    def __init__(self, host: str, port: int, request: bytes) -> None:
        self.host, self.port, self.request = host, port, request
        self.stream: trio.SocketStream | None = None
        self.reader: _Reader | None = None

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
        self.stream = self.reader = None

    async def run(self, budget: Budget, result: LoadResult) -> None:
        while budget.take():
            if self.stream is None or self.reader is None:
                self.stream = await trio.open_tcp_stream(self.host, self.port)
                # Without TCP_NODELAY small request writes wait for delayed ACKs (~40 ms).
                self.stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.reader = _Reader(self.stream)
            started = time.perf_counter()
            ok = reuse = False
            try:
                with trio.fail_after(30):
                    await self.stream.send_all(self.request)
                    status, tail, reuse = await self.reader.response(started, result.ttfb)
                # A complete answer: a stream ends with [DONE], a JSON answer carries its usage.
                ok = status == 200 and (tail.endswith(b"data: [DONE]\n\n") or b'"usage"' in tail)
            except (OSError, trio.BrokenResourceError, trio.TooSlowError, _Closed, ValueError, IndexError):
                ok = False
            if ok:
                result.latencies.append(time.perf_counter() - started)
                result.requests += 1
            else:
                result.errors += 1
            if not (ok and reuse):
                await self.close()


def _request_bytes(host: str, port: str, *, stream: bool, api_key: str | None) -> bytes:
    payload: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": STREAM_CHUNKS,
        "messages": [{"role": "user", "content": "Say something."}],
    }
    if stream:
        payload |= {"stream": True, "stream_options": {"include_usage": True}}
    body = json.dumps(payload).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def run_load(
    url: str | Sequence[str],
    *,
    stream: bool,
    concurrency: int,
    requests: int,
    seconds: float,
    api_key: str | None = None,
    on_start: Callable[[], None] | None = None,
) -> LoadResult:
    """Warm up (2 requests per connection, not counted), call ``on_start``, then run the bounded load.

    The connections opened in the warm-up are the ones measured, so connection setup stays out of
    the numbers except where a server closes connections (llama-server does, after each stream).
    Several URLs (several daemons): connection ``i`` goes to ``url[i % len(url)]``.
    """
    urls = [url] if isinstance(url, str) else list(url)
    targets = []
    for one in urls:
        host, port = one.removeprefix("http://").rsplit(":", 1)
        targets.append((host, int(port), _request_bytes(host, port, stream=stream, api_key=api_key)))

    warm = LoadResult(0, 0, 0.0, [], [])
    result = LoadResult(0, 0, 0.0, [], [])
    budget = Budget(requests, time.monotonic() + 3600)
    go = trio.Event()
    waiting = concurrency

    async def worker(index: int) -> None:
        nonlocal waiting
        conn = _Connection(*targets[index % len(targets)])
        try:
            await conn.run(Budget(2, time.monotonic() + 30), warm)
            waiting -= 1
            if waiting == 0:
                if on_start is not None:
                    on_start()
                budget.deadline = time.monotonic() + seconds
                result.seconds = time.monotonic()  # the start, until the end is known
                go.set()
            await go.wait()
            await conn.run(budget, result)
        finally:
            await conn.close()

    async with trio.open_nursery() as nursery:
        for index in range(concurrency):
            nursery.start_soon(worker, index)
    result.seconds = time.monotonic() - result.seconds
    return result


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (fields 14 and 15, after the parenthesised name)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pin(core: int | None) -> list[str]:
    if core is None or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", str(core)]


@contextmanager
def fake_engine_process(core: int | None) -> Iterator[tuple[str, int]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}
    cmd = [
        *_pin(core),
        sys.executable,
        "-m",
        "llmgw_dev.fake_engine",
        "--port",
        "0",
        "--chunks",
        str(STREAM_CHUNKS),
        "--model",
        MODEL,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"the fake engine did not start (exit {proc.poll()})")
        yield url, proc.pid
    finally:
        _stop(proc)


def gateway_available(command: Sequence[str]) -> bool:
    if not Path(command[-1]).exists():
        return False
    probe = subprocess.run([*command, "run", "--help"], capture_output=True, text=True, check=False)
    return probe.returncode == 0 and "--endpoint" in probe.stdout


@contextmanager
def gateway_process(
    command: Sequence[str], engine_url: str, core: int | None, log_path: Path, extra_args: Sequence[str]
) -> Iterator[tuple[str, int]]:
    port, admin = free_port(), free_port()
    cmd = [
        *_pin(core),
        *command,
        "run",
        "--listen",
        f"127.0.0.1:{port}",
        "--admin-listen",
        f"127.0.0.1:{admin}",
        "--endpoint",
        f"e1={engine_url}={MODEL}",
        *extra_args,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").splitlines()[-20:]
                raise RuntimeError("the gateway did not become ready:\n" + "\n".join(tail))
            time.sleep(0.05)
        # taskset execs the gateway, so the pid we started is the gateway's own.
        yield url, proc.pid
    finally:
        _stop(proc)


class _OtlpSink:
    """An OTLP/HTTP endpoint that takes every export and answers 200 (an empty
    ExportTraceServiceResponse), counting them: a collector that costs the gateway nothing."""

    def __init__(self) -> None:
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                sink.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                sink.bytes += len(body)
                sink.exports += 1
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.exports = 0
        self.spans = 0
        self.bytes = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@attrs.define
class Row:
    mode: str
    concurrency: int
    direct: LoadResult
    via: LoadResult | None
    gateway_cpu_ms: float | None
    engine_cpu_ms_direct: float
    gateway_core_share: float | None = None


def fmt_row(row: Row) -> str:
    d = row.direct
    line = (
        f"{row.mode:<10} c={row.concurrency:<4} direct {d.rps:6.0f} rps  p50 {d.pct(0.5):7.2f}"
        f"  p99 {d.pct(0.99):7.2f}  (fake cpu/req {row.engine_cpu_ms_direct:4.2f})"
    )
    if row.via is None:
        return line + "   | gateway: pending"
    v = row.via
    added = v.pct(0.5) - d.pct(0.5)
    if row.mode == "stream":
        added_ttfb = v.pct(0.5, v.ttfb) - d.pct(0.5, d.ttfb)
        line += f"  ttfb {d.pct(0.5, d.ttfb):6.2f}"
    ratio = v.rps / d.rps if d.rps else float("nan")
    cpu = f"{row.gateway_cpu_ms:5.2f}" if row.gateway_cpu_ms is not None else "  n/a"
    return (
        line
        + f"   | llmgw {v.rps:7.0f} rps  p50 {v.pct(0.5):7.2f}  p99 {v.pct(0.99):7.2f}"
        + (f"  ttfb {v.pct(0.5, v.ttfb):6.2f} (+{added_ttfb:.2f})" if row.mode == "stream" else "")
        + f"   | rps x{ratio:4.2f}  +p50 {added:6.2f} ms  cpu/req {cpu} ms"
        + (f" ({row.gateway_core_share:4.0%} of its core)" if row.gateway_core_share is not None else "")
        + (f"  errors {v.errors}" if v.errors or d.errors else "")
    )


def check_targets(rows: list[Row]) -> list[str]:
    out: list[str] = []

    def verdict(ok: bool) -> str:
        return "ok  " if ok else "MISS"

    for row in rows:
        if row.via is None or row.gateway_cpu_ms is None:
            continue
        if row.concurrency == 1:
            # For a stream the latency a user feels is the first byte; the whole stream's added
            # time is printed in the table (it is mostly per-chunk relay cost, i.e. CPU).
            values = (row.via.ttfb, row.direct.ttfb) if row.mode == "stream" else (None, None)
            added = row.via.pct(0.5, values[0]) - row.direct.pct(0.5, values[1])
            what = "time to first byte" if row.mode == "stream" else "latency"
            out.append(
                f"{verdict(added < TARGET_ADDED_P50_MS_C1)} {row.mode} c=1 added p50 {what} "
                f"{added:.2f} ms (target < {TARGET_ADDED_P50_MS_C1} ms)"
            )
        target = TARGET_CPU_MS_STREAM if row.mode == "stream" else TARGET_CPU_MS_NONSTREAM
        out.append(
            f"{verdict(row.gateway_cpu_ms <= target)} {row.mode} c={row.concurrency} gateway CPU "
            f"{row.gateway_cpu_ms:.2f} ms/request (target <= {target} ms)"
        )
    for mode in ("non-stream", "stream"):
        by_c = {r.concurrency: r for r in rows if r.mode == mode and r.via is not None}
        if 32 in by_c and 128 in by_c:
            r32, r128 = by_c[32].via, by_c[128].via
            d32, d128 = by_c[32].direct, by_c[128].direct
            assert r32 is not None and r128 is not None
            # 5% slack: a sample of a few seconds on a shared machine is that noisy.
            fell = r128.rps < 0.95 * r32.rps
            # The fake engine and the load generator share one core, and at c=128 that core can
            # be the limit: then the direct run falls too, and no proxy could hold its rate. The
            # gateway has held up if its share of what the engine side delivers did not fall.
            ratio32, ratio128 = r32.rps / max(d32.rps, 1e-9), r128.rps / max(d128.rps, 1e-9)
            engine_bound = fell and d128.rps < 0.95 * d32.rps and ratio128 >= 0.95 * ratio32
            line = (
                f"{verdict(not fell or engine_bound)} {mode} throughput c=32 {r32.rps:.0f} -> "
                f"c=128 {r128.rps:.0f} rps (target: not falling)"
            )
            if engine_bound:
                line += (
                    f"; the direct run fell as much ({d32.rps:.0f} -> {d128.rps:.0f} rps, llmgw/direct "
                    f"{ratio32:.2f} -> {ratio128:.2f}): the engine side was the limit"
                )
            out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark llmgw-control against a fake engine.")
    parser.add_argument("--quick", action="store_true", help="short run (fewer requests, shorter caps)")
    parser.add_argument("--gateway", type=Path, default=ROOT / ".venv" / "bin" / "llmgw-control")
    parser.add_argument("--gateway-arg", action="append", default=[], help="extra argument for `run`")
    parser.add_argument(
        "--bare",
        action="store_true",
        help="measure bench/bare_proxy.py (hypercorn + httpx2 and nothing else) instead: the "
        "floor of this stack, to tell llmgw's own cost from its framework's",
    )
    parser.add_argument("--api-key", default=None, help="client key to send to the gateway, if it needs one")
    parser.add_argument("--concurrency", type=int, action="append", help="default: 1, 32, 128")
    parser.add_argument(
        "--tracing", action="store_true", help="trace every request, exported over OTLP/HTTP to a sink in this process"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        metavar="N",
        help="run bench, fake engine and gateway at this nice value (negative needs root): on a "
        "shared machine -10 keeps other work from taking the measured cores",
    )
    parser.add_argument(
        "--no-realtime",
        action="store_true",
        help="leave the load generator at normal scheduling at c=1 too (see _scheduling)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help="instead: the gateway with workers=1 against workers=N in one run (bench/scale.py)",
    )
    parser.add_argument(
        "--daemons",
        type=int,
        default=0,
        metavar="N",
        help="instead: one control daemon against N on one PostgreSQL, in one run (bench/scale.py)",
    )
    args = parser.parse_args(argv)
    if args.workers or args.daemons:
        from scale import run_scale  # bench/ is on sys.path: this script's directory

        return run_scale(args)

    levels: list[int] = args.concurrency or [1, 32, 128]
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)  # the child processes inherit it
    two_cores = (os.cpu_count() or 1) >= 2
    gen_core, gw_core = (0, 1) if two_cores else (None, None)
    if gen_core is not None:
        os.sched_setaffinity(0, {gen_core})  # the load generator shares core 0 with the fake engine

    def budget(c: int) -> tuple[int, float]:
        if args.quick:
            return (150, 2.0) if c == 1 else (600, 3.0)
        return (2000, 8.0) if c == 1 else (4000, 12.0)

    gateway = [sys.executable, str(ROOT / "bench" / "bare_proxy.py")] if args.bare else [str(args.gateway)]
    have_gateway = gateway_available(gateway)
    print(
        f"llmgw bench  {time.strftime('%Y-%m-%d %H:%M')}  {os.cpu_count()} cores  "
        f"{_cpu_model()}  python {sys.version.split()[0]}"
    )
    print(
        f"code: {_revision()}  nice {os.getpriority(os.PRIO_PROCESS, 0)}"
        + ("  MEASURING bench/bare_proxy.py (the floor), not llmgw" if args.bare else "")
    )
    print(
        f"pinning: load generator + fake engine on core {gen_core}, gateway on core {gw_core}; "
        f"load average before the run {os.getloadavg()[0]:.2f} (other work on the machine skews results)"
    )
    if not have_gateway:
        print(f"{gateway[-1]} run --help failed: measuring the fake engine only; gateway figures pending")
    print("latencies in ms; cpu/req is the gateway's utime+stime per proxied request\n")

    rows: list[Row] = []
    marks: dict[str, float] = {}

    def mark(pid: int, key: str) -> Callable[[], None]:
        """Snapshot a process's CPU time when the measured load starts (after the warm-up)."""
        return lambda: marks.__setitem__(key, cpu_seconds(pid))

    with (
        tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmp,
        fake_engine_process(gen_core) as (engine_url, engine_pid),
    ):
        log_path = Path(tmp) / "gateway.log"
        # A data directory of its own: the default one is shared by every run on the machine, and
        # a run of a newer llmgw migrates its store past what an older one (a "before" run) opens.
        own_state = [] if args.bare else ["--data-dir", str(Path(tmp) / "control")]
        sink = _OtlpSink() if args.tracing else None
        if sink is not None:
            config = Path(tmp) / "control.toml"
            config.write_text(f'[tracing]\nendpoint = "{sink.url}"\nsample_ratio = 1.0\n')
            own_state += ["--config", str(config)]
        with (
            gateway_process(gateway, engine_url, gw_core, log_path, [*own_state, *args.gateway_arg])
            if have_gateway
            else _nothing()
        ) as gw:
            if not args.no_realtime:
                print("load generator at c=1: " + _scheduling(realtime=True))
                _scheduling(realtime=False)
            for mode in ("non-stream", "stream"):
                for c in levels:
                    if not args.no_realtime:
                        _scheduling(realtime=c == 1)
                    n, secs = budget(c)
                    stream = mode == "stream"
                    direct = trio.run(
                        partial(
                            run_load,
                            engine_url,
                            stream=stream,
                            concurrency=c,
                            requests=n,
                            seconds=secs,
                            on_start=mark(engine_pid, "engine"),
                        )
                    )
                    engine_cpu = (cpu_seconds(engine_pid) - marks["engine"]) * 1000 / max(1, direct.requests)
                    via: LoadResult | None = None
                    gw_cpu: float | None = None
                    gw_share: float | None = None
                    if gw is not None:
                        gw_url, gw_pid = gw
                        via = trio.run(
                            partial(
                                run_load,
                                gw_url,
                                stream=stream,
                                concurrency=c,
                                requests=n,
                                seconds=secs,
                                api_key=args.api_key,
                                on_start=mark(gw_pid, "gw"),
                            )
                        )
                        used = cpu_seconds(gw_pid) - marks["gw"]
                        gw_cpu = used * 1000 / max(1, via.requests + via.errors)
                        # How much of its core the gateway got: well under 100% while it is the
                        # bottleneck means other work on the machine took the rest.
                        gw_share = used / via.seconds if via.seconds else None
                    row = Row(mode, c, direct, via, gw_cpu, engine_cpu, gw_share)
                    rows.append(row)
                    print(fmt_row(row), flush=True)
    print(f"\nload average after the run {os.getloadavg()[0]:.2f}")
    if sink is not None:
        sink.close()
        print(f"tracing: {sink.spans} spans in {sink.exports} OTLP exports received ({sink.bytes / 1e6:.1f} MB)")
    print("targets:")
    for line in check_targets(rows) or ["(pending: no gateway measured)"]:
        print("  " + line)
    if args.json:
        args.json.write_text(json.dumps([_row_json(r) for r in rows], indent=2))
    return 0


def _scheduling(*, realtime: bool) -> str:
    """At c=1 the load generator runs at real-time priority on its core: it reads bytes when they arrive.

    It shares core 0 with the fake engine, which writes a stream's 35 events in one burst of
    about 1.5 ms of CPU. Linux (EEVDF) lets a running task finish its slice before a task it
    woke gets the core, so a stream's head relayed by the gateway on core 1 sat unread until
    the fake's burst ended: 0.5-0.8 ms counted against the gateway's time to first byte that a
    client on a machine of its own never sees. Directly, the fake writes its head before the
    burst, so the two runs were not measured alike. SCHED_FIFO lets the woken load generator
    take the core at once (it needs root; without it the run says so).

    Under load it runs at normal priority again: there it measures capacity, and a load
    generator that preempts the fake engine at every byte it is sent breaks the fake's writes
    into pieces no engine on its own machine would make, which the gateway then pays for.
    Called after the children have started, so that only the load generator runs this way.
    """
    policy, priority = (os.SCHED_FIFO, 1) if realtime else (os.SCHED_OTHER, 0)
    try:
        os.sched_setscheduler(0, policy, os.sched_param(priority))
    except (PermissionError, AttributeError, OSError) as exc:
        return f"normal scheduling (real-time priority refused: {exc}); stream first-byte times read late"
    return "SCHED_FIFO 1 (reads bytes as they arrive)" if realtime else "normal scheduling"


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _row_json(row: Row) -> dict[str, Any]:
    def res(r: LoadResult | None) -> dict[str, Any] | None:
        if r is None:
            return None
        return {
            "requests": r.requests,
            "errors": r.errors,
            "seconds": round(r.seconds, 3),
            "rps": round(r.rps, 1),
            "p50_ms": round(r.pct(0.5), 3),
            "p99_ms": round(r.pct(0.99), 3),
            "ttfb_p50_ms": round(r.pct(0.5, r.ttfb), 3),
        }

    return {
        "mode": row.mode,
        "concurrency": row.concurrency,
        "direct": res(row.direct),
        "via": res(row.via),
        "gateway_cpu_ms_per_request": row.gateway_cpu_ms,
        "gateway_core_share": row.gateway_core_share,
        "engine_cpu_ms_per_request_direct": round(row.engine_cpu_ms_direct, 3),
    }


def _revision() -> str:
    """The commit measured, and whether the gateway's sources differ from it (they often do)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "llmgw_control", "shared")
    return head + (" + uncommitted gateway changes" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    raise SystemExit(main())
