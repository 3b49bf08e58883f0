"""Node test fixtures: a local release server, the real engine archive, a node config per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from node.release_server import FileServer, run_file_server

from llmgw_dev import build_engine
from llmgw_node.config import NodeConfig
from llmgw_node.supervisor import Timing

TAG = build_engine.RELEASE_TAG


@pytest.fixture(scope="session")
def engine_archive() -> tuple[str, bytes]:
    """(asset name, bytes) of the real release-style llama-server archive (built once, cached)."""
    path = build_engine.ensure_engine()
    return path.name, path.read_bytes()


@pytest.fixture
async def files() -> AsyncIterator[FileServer]:
    async with run_file_server() as server:
        yield server


@pytest.fixture
def node_config(tmp_path: Path) -> NodeConfig:
    return NodeConfig(data_dir=str(tmp_path / "node"), node_id="test-node", token="llmgw-join-secret")


@pytest.fixture
def fast_timing() -> Timing:
    return Timing(
        health_interval=0.05,
        backoff_base=0.05,
        backoff_cap=0.4,
        stop_grace=3.0,
        drain_poll=0.05,
        adopted_poll=0.05,
        ready_health_interval=0.1,
        unhealthy_limit=3,
        health_timeout=1.0,
    )
