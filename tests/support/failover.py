"""Two control daemons sharing one PostgreSQL store, as processes, for failover tests and the bench.

Each control has its own ports, data directory and advertised agent address; nodes get both
control URLs and follow refusals to the leader. Everything listens on 127.0.0.1. The role of a
control is read from its client ``/healthz``: 200 is the leader (or a serving standby:
``role: standby``), 503 ``standby`` a standby that does not serve.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
import httpx2
import tomli_w
import trio

from llmgw_dev.engine_proc import free_port
from support.waiting import wait_until

from .fleet import (
    BIN,
    Daemon,
    admin_state,
    control_settings,
    engine_pids,
    kill_pids,
    model_entry,
    node_ready,
    place_files,
    start_node,
    wait_for_state,
)

# Short on purpose: the whole failover file must run in well under two minutes. The settle time
# covers a node's worst reconnect: a connect to the killed leader's port that hangs for the node's
# whole connect timeout (10 s, seen under load) plus its backoff (at most 1 s here).
FAST_LEADERSHIP = {"ttl": 2.0, "renew_interval": 0.5, "settle": 12.0}


@attrs.define
class Control:
    name: str
    root: Path
    api_port: int
    admin_port: int
    agent_port: int
    daemon: Daemon

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def agent_http(self) -> str:
        return f"http://127.0.0.1:{self.agent_port}"

    @property
    def agent_ws(self) -> str:
        return f"ws://127.0.0.1:{self.agent_port}/agent/v1"

    async def role(self, client: httpx2.AsyncClient) -> tuple[str, dict[str, Any]]:
        """``leader``, ``standby`` or ``down`` (not answering), with the health document."""
        try:
            response = await client.get(self.api_url + "/healthz", timeout=1)
        except httpx2.TransportError:
            return "down", {}
        body: dict[str, Any] = response.json()
        if response.status_code == 200:
            # A standby that serves says so in a 200 (leadership.standby_serves).
            return str(body.get("role", "leader")), body
        return str(body.get("status", response.status_code)), body

    async def wait_role(self, role: str, timeout: float = 30, poll: float = 0.02) -> float:
        """Wait until this control reports ``role``; return ``time.monotonic()`` when it first did."""
        async with httpx2.AsyncClient() as client:

            async def reached() -> float | None:
                seen, _ = await self.role(client)
                if seen != role:
                    # A daemon that exited (a port taken since it was picked, say) never gets there:
                    # say so with its log at once, rather than a bare timeout later.
                    process = self.daemon.process
                    assert process is None or process.returncode is None, (
                        f"{self.name} exited with {process.returncode}:\n{self.daemon.log()[-3000:]}"
                    )
                return time.monotonic() if seen == role else None

            try:
                at: float = await wait_until(reached, timeout=timeout, interval=poll)
            except trio.TooSlowError:
                raise AssertionError(f"{self.name} never said {role}:\n{self.daemon.log()[-3000:]}") from None
            return at

    async def state(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return await admin_state(self.admin_url)

    async def wait_for(self, predicate: Any, timeout: float = 60) -> tuple[list[Any], list[Any]]:
        return await wait_for_state(self.admin_url, predicate, timeout)


@attrs.define
class Pair:
    root: Path
    store_url: str
    controls: list[Control]
    nodes: dict[str, Daemon] = attrs.Factory(dict)

    def control_urls(self) -> list[str]:
        return [c.agent_ws for c in self.controls]

    async def add_node(self, node_id: str, leader: Control, *, engine: bool = True) -> Daemon:
        daemon = await start_node(self.root, node_id, self.control_urls(), self.nodes)
        await leader.wait_for(node_ready(node_id, engine=engine))
        return daemon

    def engine_pids(self) -> list[int]:
        return engine_pids(self.root)

    def kill_engines(self) -> None:
        kill_pids(self.engine_pids())


def _control_config(
    control: Control, store_url: str, files: Path | None, models: list[dict[str, Any]], leadership: dict[str, Any]
) -> dict[str, Any]:
    config = control_settings(control.api_port, control.admin_port, control.agent_port, control.root / "data", models)
    config["agents"]["public_url"] = control.agent_http
    if files is not None:
        config["agents"]["files_dir"] = str(files)
    return {**config, "store": store_url, "leadership": {**leadership, "advertise": control.agent_ws}}


@asynccontextmanager
async def control_pair(
    root: Path,
    store_url: str,
    *,
    tiny_model: Path | None = None,
    engine_archive: Path | None = None,
    leadership: dict[str, Any] | None = None,
    c1_store: str | None = None,
) -> AsyncIterator[Pair]:
    """Two controls on ``store_url``; ``c1`` is started first and leads. With ``tiny_model`` and
    ``engine_archive`` both serve model ``tiny`` and the engine to nodes (from their own URLs).
    ``c1_store`` is another URL of the same database for ``c1`` (e.g. through a ``TcpProxy``)."""
    files = None
    if tiny_model is not None and engine_archive is not None:
        files = place_files(root, engine_archive, tiny_model)
    controls = []
    for name in ("c1", "c2"):
        (root / name).mkdir(parents=True)
        control = Control(
            name, root / name, free_port(), free_port(), free_port(), Daemon(name, [], root / f"{name}.log")
        )
        models = [model_entry("tiny", tiny_model, control.agent_http)] if files is not None and tiny_model else []
        path = root / name / "control.toml"
        store = c1_store if c1_store and name == "c1" else store_url
        path.write_text(tomli_w.dumps(_control_config(control, store, files, models, leadership or FAST_LEADERSHIP)))
        control.daemon.argv = [str(BIN / "llmgw-control"), "run", "--config", str(path)]
        controls.append(control)
    pair = Pair(root, store_url, controls)
    try:
        await controls[0].daemon.start()
        await controls[0].wait_role("leader")
        await controls[1].daemon.start()
        await controls[1].wait_role("standby")
        yield pair
    finally:
        with trio.CancelScope(shield=True):
            for node in pair.nodes.values():
                await node.stop(signal.SIGKILL)
            for control in controls:
                await control.daemon.stop(signal.SIGKILL)
            pair.kill_engines()


class TcpProxy:
    """A TCP relay to 127.0.0.1:``target``; ``cut()`` closes every connection and refuses new ones,
    as a network failure between one daemon and its database would."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.is_cut = False
        self._scopes: set[trio.CancelScope] = set()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._relay, listeners)

    def cut(self) -> None:
        self.is_cut = True
        for scope in list(self._scopes):
            scope.cancel()

    async def _relay(self, client: trio.SocketStream) -> None:
        async with client:
            if self.is_cut:
                return
            with trio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    upstream = await trio.open_tcp_stream("127.0.0.1", self.target)
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
                        nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)
                finally:
                    self._scopes.discard(scope)

    @staticmethod
    async def _pump(source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope) -> None:
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await source.receive_some(65536):
                await sink.send_all(data)
        done.cancel()
