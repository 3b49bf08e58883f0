"""Root fixtures shared by every test folder: the tiny model, real llama-server engines, the fake engine.

Real engines are session-scoped and synchronous (pytest-trio's async fixtures must be
function-scoped): each one starts once, ~0.1 s, and serves every test that asks for it. Tests that
use them get the ``engine`` marker automatically, so ``pytest -m "not engine"`` runs without a
llama-server build.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from llmgw_dev import build_engine
from llmgw_dev.engine_proc import LlamaServer, llama_server_process
from llmgw_dev.engine_proc import free_port as _free_port
from llmgw_dev.fake_engine import FakeEngine, run_fake_engine
from llmgw_dev.postgres import PostgresServer, PostgresUnavailable
from llmgw_dev.tiny_model import ensure_model

_SYSTEM = Path(__file__).resolve().parent / "system"
REAL_ENGINE_FIXTURES = frozenset({"llama_server_binary", "real_engine", "real_embedding_engine"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Marking by fixture use means nobody can forget the marker on a test that needs the build.
    # Without a cached build the first such test compiles llama-server (~10 minutes on 2 cores):
    # give those tests room instead of letting the 300 s default kill the build half-way.
    building = not (build_engine.cache_dir() / "engines" / build_engine.archive_name()).exists()
    for item in items:
        # Whole daemons as processes: left out of the quick tier (README: -m "not system").
        # Tests marked slow (a second or more each: processes, Chromium, SmolLM2, the PostgreSQL
        # variants of the store tests) are left out with them, so the quick tier stays under 2 minutes.
        if _SYSTEM in Path(str(item.fspath)).parents or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.system)
        if REAL_ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
            if building:
                item.add_marker(pytest.mark.timeout(1800))


@pytest.fixture
def free_port() -> Callable[[], int]:
    """Call it for a TCP port on 127.0.0.1 that was free a moment ago."""
    return _free_port


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny GGUF chat model (written once into the cache, then reused)."""
    return ensure_model()


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """The real llama-server; waits for a build in progress, builds (~10 min) if the cache lacks it."""
    return build_engine.server_binary()


@pytest.fixture(scope="session")
def real_engine(llama_server_binary: Path, tiny_model: Path) -> Iterator[LlamaServer]:
    """A chat llama-server on the tiny model, alias ``tiny``: ``.url``, ``.model``."""
    with llama_server_process(llama_server_binary, tiny_model, alias="tiny") as server:
        yield server


@pytest.fixture(scope="session")
def real_embedding_engine(llama_server_binary: Path, tiny_model: Path) -> Iterator[LlamaServer]:
    """A second llama-server with ``--embeddings --pooling mean``, alias ``tiny-embed``.

    b11312 started with ``--embeddings`` still serves chat and completions, so one process could do
    both; we keep two anyway because that is how a fleet deploys them (a chat model without
    ``--embeddings``, which then answers ``/v1/embeddings`` with 501, and an embedding model under
    its own name), and because with ``--embeddings`` every generated token also computes embedding
    outputs. Starting it costs ~0.1 s and ~25 MB, and only sessions that ask for it pay.
    """
    with llama_server_process(llama_server_binary, tiny_model, alias="tiny-embed", embeddings=True) as server:
        yield server


@pytest.fixture
async def fake_engine() -> AsyncIterator[FakeEngine]:
    """A running fake engine with default behaviour; change ``fake_engine.behavior`` as needed."""
    async with run_fake_engine() as engine:
        yield engine


_db_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL for the whole session (started on first use, ~2 s)."""
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        # A failure, not a skip: half the store suite silently not running is worse.
        pytest.fail(f"these tests need PostgreSQL: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_database(pg_server: PostgresServer) -> Iterator[str]:
    """The name of a fresh, empty database on the session's server (dropped afterwards)."""
    name = f"t{os.getpid()}_{next(_db_numbers)}"
    pg_server.create_database(name)
    yield name
    pg_server.drop_database(name)


@pytest.fixture
def pg_url(pg_server: PostgresServer, pg_database: str) -> str:
    """A postgresql:// URL for a fresh database."""
    return pg_server.url(pg_database)


@pytest.fixture(scope="session")
def tiny_gguf() -> bytes:
    """The tiny model's bytes: a real GGUF file for the model mirror's fake Hub."""
    return Path(ensure_model()).read_bytes()
