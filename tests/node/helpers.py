"""Small helpers for node tests: wait for state reports, build replica specs, mount a small disk."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from functools import partial
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket

from llmgw_node.service import NodeService, Report
from llmgw_shared.wire import (
    EngineState,
    EngineStateReport,
    Message,
    ReplicaSpec,
    ReplicaState,
    ReplicaStateReport,
    WeightsSpec,
    decode,
)


async def next_replica_state(
    svc: NodeService,
    replica_id: str,
    pred: Callable[[ReplicaState], bool],
    *,
    seen: list[ReplicaState] | None = None,
    limit_s: float = 60.0,
) -> ReplicaState:
    """Read reports until ``shard_id`` reaches a state matching ``pred``; collect what passed by."""
    with trio.fail_after(limit_s):
        async for report in svc.reports:
            if isinstance(report, ReplicaStateReport) and report.replica.replica_id == replica_id:
                if seen is not None:
                    seen.append(report.replica)
                if pred(report.replica):
                    return report.replica
    raise AssertionError("report channel closed")


async def next_engine_state(
    svc: NodeService, pred: Callable[[EngineState], bool], *, limit_s: float = 60.0
) -> EngineState:
    with trio.fail_after(limit_s):
        async for report in svc.reports:
            if isinstance(report, EngineStateReport) and pred(report.engine):
                return report.engine
    raise AssertionError("report channel closed")


def drain_reports(svc: NodeService) -> list[Report]:
    out: list[Report] = []
    while True:
        try:
            out.append(svc.reports.receive_nowait())
        except trio.WouldBlock:
            return out


def replica_spec(
    replica_id: str,
    weights: WeightsSpec,
    port: int,
    *,
    api_key: str = "sk-shard-test",
    args: list[str] | None = None,
    max_restarts: int = 3,
    version: str = "b11312",
) -> ReplicaSpec:
    return ReplicaSpec(
        replica_id=replica_id,
        engine="llama.cpp",
        engine_version=version,
        weights=weights,
        port=port,
        api_key=api_key,
        # One thread: on a busy 2-core machine the default thread count makes answers crawl.
        args=args if args is not None else ["-t", "1", "-c", "1024", "-np", "2", "--metrics", "--alias", "tiny"],
        start_timeout_s=30.0,
        max_restarts=max_restarts,
    )


def local_weights(path: Path) -> WeightsSpec:
    import hashlib

    data = path.read_bytes()
    return WeightsSpec(url=str(path), sha256=hashlib.sha256(data).hexdigest(), size=len(data))


Behaviour = Callable[[WebSocketConnection], Awaitable[None]]


@asynccontextmanager
async def fake_control(behaviour: Behaviour) -> AsyncIterator[str]:
    """A trio-websocket server on 127.0.0.1 playing control; yields its agent URL."""

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        with suppress(ConnectionClosed):
            await behaviour(ws)

    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(serve_websocket, handler, "127.0.0.1", 0, None))
        yield f"ws://127.0.0.1:{server.port}/agent/v1"
        nursery.cancel_scope.cancel()


async def receive(ws: WebSocketConnection, limit_s: float = 10.0) -> Message:
    with trio.fail_after(limit_s):
        return decode(await ws.get_message())


@contextmanager
def small_filesystem(path: Path, size: str, *, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (and at most ``inodes`` files) mounted at ``path``, unmounted after.

    A real small filesystem is the only honest way to see what a full disk does; skipped, with
    the reason, where this process may not mount (not root, or no CAP_SYS_ADMIN in a container).
    """
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}); "
            "the full-disk test needs root or CAP_SYS_ADMIN"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)
