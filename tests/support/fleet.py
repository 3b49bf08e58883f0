"""Real daemons as processes for system tests: one control, several nodes, the real engine.

Everything listens on 127.0.0.1 with ports chosen at start. Control serves the engine archive
and the tiny model from a files directory (hard links to the build cache), so nodes install the
real llama-server exactly as an air-gapped cluster would. Every engine a test started is killed
at the end, found by its command line (which names the test's own directory).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
import httpx2
import tomli_w
import trio

from llmgw_control.fleet.agents import token_digest
from llmgw_dev.build_engine import archive_name
from llmgw_dev.engine_proc import free_port
from llmgw_dev.served_files import place
from support.waiting import wait_until

BIN = Path(sys.executable).parent
TOKEN = "llmgw-join-system-test"


def model_entry(name: str, model_file: Path, public_url: str, **profile: Any) -> dict[str, Any]:
    sha = hashlib.sha256(model_file.read_bytes()).hexdigest()
    weights = {"url": f"{public_url}/files/models/{model_file.name}", "sha256": sha, "size": model_file.stat().st_size}
    return {
        "name": name,
        "profiles": [
            {"name": "cpu", "weights": weights, "context": 256, "parallel": 2, "args": ["-t", "1"], **profile}
        ],
    }


@attrs.define
class Daemon:
    name: str
    argv: list[str]
    log_path: Path
    process: trio.Process | None = None

    async def start(self) -> None:
        with open(self.log_path, "ab") as log:  # noqa: ASYNC230 -- a local file, opened once
            self.process = await trio.lowlevel.open_process(self.argv, stdout=log, stderr=subprocess.STDOUT)

    def send_signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(sig)

    async def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 15) -> int | None:
        if self.process is None:
            return None
        self.send_signal(sig)
        with trio.move_on_after(timeout):
            return await self.process.wait()
        self.process.kill()
        return await self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@attrs.define
class Fleet:
    root: Path
    control_port: int
    admin_port: int
    agent_port: int
    control: Daemon
    nodes: dict[str, Daemon] = attrs.Factory(dict)
    # Where llmgw-control and llmgw-node are: this environment's, or a venv made with plain pip.
    bin_dir: Path = BIN

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def agent_url(self) -> str:
        return f"http://127.0.0.1:{self.agent_port}"

    async def wait_healthy(self, url: str, timeout: float = 30) -> None:
        async with httpx2.AsyncClient() as client:

            async def healthy() -> bool:
                try:
                    return (await client.get(url + "/healthz")).status_code == 200
                except httpx2.TransportError:
                    return False

            await wait_until(healthy, timeout=timeout, interval=0.1)

    async def start_control(self) -> None:
        await self.control.start()
        await self.wait_healthy(self.api_url)

    async def add_node(self, node_id: str) -> Daemon:
        daemon = await start_node(
            self.root, node_id, [f"ws://127.0.0.1:{self.agent_port}/agent/v1"], self.nodes, bin_dir=self.bin_dir
        )
        # Ready, with its engine installed and proven (the archive comes from control's file server).
        await self.wait_for(node_ready(node_id))
        return daemon

    async def state(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return await admin_state(self.admin_url)

    async def wait_for(self, predicate: Any, timeout: float = 60) -> tuple[list[Any], list[Any]]:
        return await wait_for_state(self.admin_url, predicate, timeout)

    def engine_pids(self, node_id: str | None = None) -> list[int]:
        """Serving llama-server processes started under this fleet's directory (or one node's)."""
        return engine_pids(self.root / node_id if node_id else self.root)

    def kill_engines(self, node_id: str | None = None) -> None:
        kill_pids(self.engine_pids(node_id))


async def admin_state(admin_url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The nodes and models a control daemon's admin API reports."""
    async with httpx2.AsyncClient(base_url=admin_url, timeout=10) as client:
        nodes = (await client.get("/api/v1/nodes")).json()["nodes"]
        models = (await client.get("/api/v1/models")).json()["models"]
    return nodes, models


async def wait_for_state(
    admin_url: str, predicate: Any, timeout: float = 60, poll: float = 0.1
) -> tuple[list[Any], list[Any]]:
    async def holds() -> tuple[list[Any], list[Any]] | None:
        try:
            nodes, models = await admin_state(admin_url)
        except httpx2.TransportError:
            return None
        return (nodes, models) if predicate(nodes, models) else None

    state: tuple[list[Any], list[Any]] = await wait_until(holds, timeout=timeout, interval=poll)
    return state


async def start_node(
    root: Path, node_id: str, controls: list[str], nodes: dict[str, Daemon], *, bin_dir: Path = BIN
) -> Daemon:
    """A node daemon connecting to ``controls``, started and added to ``nodes``."""
    data = root / node_id
    data.mkdir(exist_ok=True)
    # Each node's engines on their own loopback address, as if on their own machine: ports
    # chosen per node can then never collide between nodes sharing this host.
    config = {
        "control": controls,
        "token": TOKEN,
        "node_id": node_id,
        "data_dir": str(data),
        "reconnect_min_s": 0.2,
        "reconnect_max_s": 1.0,
        "engine_host": f"127.0.0.{len(nodes) + 1}",
    }
    path = root / f"{node_id}.toml"
    path.write_text(tomli_w.dumps(config))
    daemon = Daemon(node_id, [str(bin_dir / "llmgw-node"), "run", "--config", str(path)], root / f"{node_id}.log")
    nodes[node_id] = daemon
    await daemon.start()
    return daemon


def node_ready(node_id: str, *, engine: bool = True) -> Any:
    """A ``wait_for`` predicate: ``node_id`` is ready (and, with ``engine``, has its engine installed)."""
    return lambda nodes, models: any(
        n["id"] == node_id
        and n["state"] == "ready"
        and (not engine or any(e["state"].startswith("installed") for e in n["engines"]))
        for n in nodes
    )


def place_files(root: Path, engine_archive: Path, tiny_model: Path) -> Path:
    """The files directory control serves nodes: the engine archive and the tiny model."""
    files = root / "files"
    (files / "engines").mkdir(parents=True)
    (files / "models").mkdir()
    # In the tree, not linked to the cache: control serves nothing whose real path leaves it.
    place(engine_archive, files / "engines" / archive_name())
    place(tiny_model, files / "models" / tiny_model.name)
    return files


def control_settings(
    api_port: int, admin_port: int, agent_port: int, data_dir: Path, models: list[dict[str, Any]]
) -> dict[str, Any]:
    """What every system test's control runs with: fast timings, the test token, JSON logs."""
    return {
        "listen": f"127.0.0.1:{api_port}",
        "admin_listen": f"127.0.0.1:{admin_port}",
        "data_dir": str(data_dir),
        "log_format": "json",
        "shutdown_grace": 2.0,
        "agents": {
            "listen": f"127.0.0.1:{agent_port}",
            "join_token_digests": [token_digest(TOKEN)],
            "heartbeat_interval": 0.5,
            "unreachable_after": 2.0,
            "lost_after": 4.0,
        },
        "reconciler": {"interval": 0.5, "backoff_base": 1.0, "backoff_cap": 5.0},
        "activator": {"max_wait": 60.0},
        "models": models,
    }


def engine_pids(under: Path) -> list[int]:
    """Serving llama-server processes whose command line names a path under ``under``.

    ``--port`` leaves out the short ``llama-server --version`` runs a node makes when it re-proves
    an installed engine, which would otherwise look like a restarted engine to a pid comparison.
    """
    marker = str(under)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "llama-server" in cmdline and marker in cmdline and "--port" in cmdline:
                pids.append(int(entry.name))
    return sorted(pids)


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def write_control_config(root: Path, fleet: Fleet, models: list[dict[str, Any]], **extra: Any) -> Path:
    config = control_settings(fleet.control_port, fleet.admin_port, fleet.agent_port, root / "control", models)
    config["agents"]["files_dir"] = str(root / "files")
    for section, values in extra.items():
        if isinstance(values, dict):
            config.setdefault(section, {}).update(values)
        else:
            config[section] = values
    path = root / "control.toml"
    path.write_text(tomli_w.dumps(config))
    return path


@asynccontextmanager
async def running_fleet(
    root: Path,
    tiny_model: Path,
    engine_archive: Path,
    *,
    models: list[tuple[str, dict[str, Any]]] | None = None,
    control_bin: Path = BIN,
    node_bin: Path = BIN,
    **extra: Any,
) -> AsyncIterator[Fleet]:
    place_files(root, engine_archive, tiny_model)
    fleet = Fleet(
        root, free_port(), free_port(), free_port(), Daemon("control", [], root / "control.log"), bin_dir=node_bin
    )
    public = fleet.agent_url
    entries = [model_entry(name, tiny_model, public, **profile) for name, profile in (models or [("tiny", {})])]
    config = write_control_config(root, fleet, entries, **extra)
    fleet.control.argv = [str(control_bin / "llmgw-control"), "run", "--config", str(config)]
    try:
        await fleet.start_control()
        yield fleet
    finally:
        with trio.CancelScope(shield=True):
            for node in fleet.nodes.values():
                await node.stop(signal.SIGKILL)
            await fleet.control.stop(signal.SIGKILL)
            fleet.kill_engines()
