"""The files control serves (engine archives, weights, node release wheels, the dashboard's static files), on the real
daemon over real sockets: ranges parsed strictly, nothing outside the served directories, and engine
files only for enrolled nodes."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import httpx2
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from system.releases import fake_release

from llmgw_control.app import Listening, run_control
from llmgw_control.config import ControlConfig, validate
from llmgw_control.fleet.agents import AgentsConfig, token_digest

TOKEN = "llmgw-join-files-test"
DATA = bytes(range(256)) * 4 + b"tail"  # 1028 bytes, every offset distinguishable
WHEEL = "llmgw_node-0.1.0-py3-none-any.whl"
# A node release (what `llmgw-control release prepare` writes) holding WHEEL; its id follows from
# its requirements.
REQUIREMENTS = f"llmgw-node==0.1.0 --hash=sha256:{hashlib.sha256(DATA).hexdigest()}\n"
RELEASE = "0.1.0-" + hashlib.sha256(REQUIREMENTS.encode()).hexdigest()[:12]
RELEASE_PAGE = f"/install/releases/{RELEASE}/"


@attrs.frozen
class Served:
    listening: Listening
    files: Path

    @property
    def agent_url(self) -> str:
        assert self.listening.agent_url
        return self.listening.agent_url


@asynccontextmanager
async def control_serving_files(root: Path, **agents: object) -> AsyncIterator[Served]:
    files = root / "files"
    for kind in ("engines", "models"):
        (files / kind).mkdir(parents=True, exist_ok=True)
    (files / "models" / "m.gguf").write_bytes(DATA)
    if not (files / "node-releases").exists():
        assert fake_release(files / "node-releases", {WHEEL: DATA}, REQUIREMENTS) == RELEASE
    config = validate(
        ControlConfig(
            listen="127.0.0.1:0",
            admin_listen="127.0.0.1:0",
            data_dir=str(root / "control"),
            shutdown_grace=1.0,
            agents=AgentsConfig(
                listen="127.0.0.1:0", files_dir=str(files), join_token_digests=[token_digest(TOKEN)], **agents
            ),
        )
    )  # type: ignore[arg-type]
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(
            lambda task_status: run_control(config, shutdown=shutdown, task_status=task_status)
        )
        yield Served(listening, files)
        shutdown.set()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with control_serving_files(tmp_path) as s:
        yield s


def node_client(base_url: str) -> httpx2.Client:
    """A node's credentials, as llmgw-node sends them when it fetches from control."""
    return httpx2.Client(base_url=base_url, auth=("n1", TOKEN), timeout=20)


# --------------------------------------------------------------------------- ranges


def expected(header: str, size: int) -> tuple[int, int | None, int | None]:
    """(status, first, last) for a well-formed single bytes range, computed with Python's big ints."""
    first_text, last_text = header.removeprefix("bytes=").split("-")
    if not first_text:
        suffix = int(last_text)
        return (416, None, None) if suffix == 0 else (206, max(0, size - suffix), size - 1)
    first = int(first_text)
    if last_text and int(last_text) < first:
        return 200, None, None
    if first >= size:
        return 416, None, None
    return 206, first, size - 1 if not last_text else min(int(last_text), size - 1)


def check_answer(response: httpx2.Response, header: str, data: bytes) -> None:
    """Whatever the header: the whole file, one exact range, or 416 naming the size; never anything else."""
    assert response.status_code in (200, 206, 416), (header, response.status_code, response.text[:200])
    if response.status_code == 200:
        assert response.content == data and "content-range" not in response.headers, header
    elif response.status_code == 206:
        match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", response.headers["content-range"])
        assert match, (header, response.headers["content-range"])
        first, last, size = (int(g) for g in match.groups())
        assert size == len(data) and 0 <= first <= last < size, header
        assert response.content == data[first : last + 1], header
    else:
        assert response.headers["content-range"] == f"bytes */{len(data)}", header
        assert response.json()["error"]["code"] == "range_not_satisfiable"


NUMBERS = st.integers(0, 1100) | st.integers(0, 10**45) | st.just(len(DATA)) | st.just(len(DATA) - 1)
WELL_FORMED = (
    st.tuples(NUMBERS, NUMBERS).map(lambda p: f"bytes={p[0]}-{p[1]}")
    | NUMBERS.map(lambda n: f"bytes={n}-")
    | NUMBERS.map(lambda n: f"bytes=-{n}")
)
# (A header value cannot start or end with whitespace on the wire: h11 refuses to send one.)
ANYTHING = (
    st.text(alphabet=st.sampled_from("bytes=0123456789-, ;BYTESitem\t"), max_size=40)
    | st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
    | st.lists(WELL_FORMED.map(lambda h: h.removeprefix("bytes=")), min_size=2, max_size=4).map(
        lambda specs: "bytes=" + ", ".join(specs)
    )
).map(lambda text: text.strip(" \t"))


@pytest.mark.slow  # left out of the quick tier: hypothesis over range headers, seconds per file
@pytest.mark.parametrize("path", ["/files/models/m.gguf", RELEASE_PAGE + WHEEL])
async def test_every_range_header_gets_the_file_a_range_or_416(served: Served, path: str) -> None:
    def run(client: httpx2.Client) -> None:
        @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(WELL_FORMED)
        def well_formed(header: str) -> None:
            response = client.get(path, headers={"Range": header})
            check_answer(response, header, DATA)
            status, first, last = expected(header, len(DATA))
            assert response.status_code == status, (header, response.status_code)
            if status == 206:
                assert response.headers["content-range"] == f"bytes {first}-{last}/{len(DATA)}"

        @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(ANYTHING)
        def anything(header: str) -> None:
            check_answer(client.get(path, headers={"Range": header}), header, DATA)

        well_formed()
        anything()

    with node_client(served.agent_url) as client:
        await trio.to_thread.run_sync(run, client)
    # The same process still serves a plain request on a new connection.
    with node_client(served.agent_url) as client:
        assert (await trio.to_thread.run_sync(client.get, path)).content == DATA


@pytest.mark.parametrize(
    ("header", "status", "content_range"),
    [
        ("bytes=0-" + "9" * 40, 206, f"bytes 0-{len(DATA) - 1}/{len(DATA)}"),
        ("bytes=1000-" + "9" * 40, 206, f"bytes 1000-{len(DATA) - 1}/{len(DATA)}"),
        ("bytes=" + "9" * 40 + "-", 416, f"bytes */{len(DATA)}"),
        ("bytes=-" + "9" * 40, 206, f"bytes 0-{len(DATA) - 1}/{len(DATA)}"),
        ("bytes=" + "9" * 5000 + "-" + "9" * 5001, 416, f"bytes */{len(DATA)}"),
        ("bytes=5-2", 200, None),
        ("bytes=0-1,3-4", 200, None),
        ("items=0-1", 200, None),
        ("bytes=", 200, None),
        ("garbage", 200, None),
        (f"bytes={len(DATA)}-", 416, f"bytes */{len(DATA)}"),
        ("bytes=-0", 416, f"bytes */{len(DATA)}"),
    ],
)
async def test_the_reported_ranges(served: Served, header: str, status: int, content_range: str | None) -> None:
    async with httpx2.AsyncClient(base_url=served.agent_url, auth=("n1", TOKEN)) as client:
        response = await client.get("/files/models/m.gguf", headers={"Range": header})
    assert response.status_code == status, response.text[:300]
    assert response.headers.get("content-range") == content_range


async def test_if_range_with_another_validator_gets_the_whole_file(served: Served) -> None:
    async with httpx2.AsyncClient(base_url=served.agent_url, auth=("n1", TOKEN)) as client:
        whole = await client.get("/files/models/m.gguf")
        etag = whole.headers["etag"]
        same = await client.get("/files/models/m.gguf", headers={"Range": "bytes=4-7", "If-Range": etag})
        assert same.status_code == 206 and same.content == DATA[4:8]
        other = await client.get("/files/models/m.gguf", headers={"Range": "bytes=4-7", "If-Range": '"other"'})
        assert other.status_code == 200 and other.content == DATA


@pytest.mark.parametrize("listener", ["admin", "api"])
async def test_the_dashboards_static_files_parse_ranges_the_same_way(served: Served, listener: str) -> None:
    base, path = {
        "admin": (served.listening.admin_url, "/dashboard-static/dashboard.css"),
        "api": (served.listening.api_url, "/admin/dashboard-static/dashboard.css"),
    }[listener]
    async with httpx2.AsyncClient(base_url=base) as client:
        whole = await client.get(path)
        assert whole.status_code == 200, whole.text[:200]
        for header in ("bytes=0-" + "9" * 40, "bytes=" + "9" * 40 + "-", "bytes=3-1", "bytes=2-5"):
            check_answer(await client.get(path, headers={"Range": header}), header, whole.content)


# --------------------------------------------------------------------------- what leaves the tree


async def test_a_link_out_of_its_directory_is_not_served(tmp_path: Path) -> None:
    secret = tmp_path / "control-secret"
    secret.write_bytes(b"the cluster secret")
    root = tmp_path / "root"
    files = root / "files"
    for kind in ("engines", "models"):
        (files / kind).mkdir(parents=True)
    (files / "engines" / "llama-b1-bin-ubuntu-x64.tar.gz").symlink_to(secret)
    (files / "engines" / "llama-b1-bin-ubuntu-arm64.tar.gz").write_bytes(b"archive")
    (files / "models" / "leak.gguf").symlink_to(secret)
    (files / "models" / "up.gguf").symlink_to("../engines/llama-b1-bin-ubuntu-arm64.tar.gz")
    (files / "models" / "alias.gguf").symlink_to("m.gguf")  # a link inside the directory: allowed
    # A wheel the release lists, replaced after it was prepared by a link to the secret.
    fake_release(files / "node-releases", {WHEEL: DATA, "llmgw_node-9-py3-none-any.whl": b"w"}, REQUIREMENTS)
    leak = files / "node-releases" / RELEASE / "llmgw_node-9-py3-none-any.whl"
    leak.unlink()
    leak.symlink_to(secret)
    async with control_serving_files(root) as served:

        def get(path: str) -> httpx2.Response:
            with node_client(served.agent_url) as client:
                return client.get(path)

        for path in (
            "/files/models/leak.gguf",
            "/files/models/up.gguf",
            "/files/engines/llama-b1-bin-ubuntu-x64.tar.gz",
            RELEASE_PAGE + "llmgw_node-9-py3-none-any.whl",
            "/files/models/..%2F..%2Fcontrol-secret",
            "/files/models/%2e%2e",
        ):
            response = await trio.to_thread.run_sync(get, path)
            assert response.status_code == 404, (path, response.status_code)
            assert b"cluster secret" not in response.content
        assert (await trio.to_thread.run_sync(get, "/files/models/alias.gguf")).content == DATA
        release = (await trio.to_thread.run_sync(get, "/releases/llama.cpp/b1")).json()
        assert [a["name"] for a in release["assets"]] == ["llama-b1-bin-ubuntu-arm64.tar.gz"]
        index = (await trio.to_thread.run_sync(get, RELEASE_PAGE)).text
        assert "llmgw_node-9" not in index and WHEEL in index


async def test_a_kind_directory_may_itself_be_a_link_the_operator_made(tmp_path: Path) -> None:
    store = tmp_path / "weights-store"
    store.mkdir()
    (store / "big.gguf").write_bytes(DATA)
    root = tmp_path / "root"
    (root / "files").mkdir(parents=True)
    (root / "files" / "models").symlink_to(store)
    async with control_serving_files(root) as served:
        async with httpx2.AsyncClient(base_url=served.agent_url, auth=("n1", TOKEN)) as client:
            assert (await client.get("/files/models/big.gguf")).content == DATA


# --------------------------------------------------------------------------- enrolled nodes only


NODE_FILES = [
    "/files/models/m.gguf",
    RELEASE_PAGE,
    RELEASE_PAGE + WHEEL,
    "/releases/llama.cpp/b11312",
    "/releases/llama.cpp/b11312.minisig",
]


@pytest.mark.parametrize(
    "auth",
    [None, ("n1", "wrong"), ("../..", TOKEN), ("n1", ""), ("", "")],
    ids=["none", "wrong token", "bad node id", "empty token", "empty"],
)
async def test_files_are_for_enrolled_nodes_only(served: Served, auth: tuple[str, str] | None) -> None:
    async with httpx2.AsyncClient(base_url=served.agent_url, auth=auth) as client:
        for path in NODE_FILES:
            response = await client.get(path)
            assert response.status_code == 401, (path, response.status_code, response.text[:200])
            assert response.json()["error"]["code"] == "node_credentials_required"
            assert response.headers["www-authenticate"].startswith("Basic")
        # No other spelling of a path gets past: the route decides, not the text.
        for path in (
            "//files/models/m.gguf",
            "/files//models/m.gguf",
            "/files/models/./m.gguf",
            "/releases//llama.cpp/b11312",
        ):
            response = await client.get(path, follow_redirects=True)
            assert response.content != DATA and response.status_code in (401, 404), (path, response.status_code)
        # The onboarding script is for machines that are not nodes yet; health is for anyone.
        assert (await client.get("/install/node.sh")).status_code != 401
        assert (await client.get("/healthz")).status_code == 200


async def test_an_onboarded_node_fetches_with_its_own_token(tmp_path: Path) -> None:
    own = "llmgw-join-own-token-of-gpu-3"
    async with control_serving_files(tmp_path) as served:
        async with httpx2.AsyncClient(base_url=served.agent_url) as client:
            assert (await client.get("/files/models/m.gguf", auth=("gpu-3", own))).status_code == 401
        from llmgw_control.store import open_store

        async with open_store(str(tmp_path / "control" / "llmgw.db")) as store:
            await store.add_node("gpu-3", token_digest(own))
        async with httpx2.AsyncClient(base_url=served.agent_url) as client:
            assert (await client.get("/files/models/m.gguf", auth=("gpu-3", own))).content == DATA
            # Its token is its own: not another id's, and the shared one is not its.
            assert (await client.get("/files/models/m.gguf", auth=("gpu-4", own))).status_code == 401
            assert (await client.get("/files/models/m.gguf", auth=("gpu-3", TOKEN))).status_code == 401


async def test_the_node_sends_its_credentials_to_control_and_to_nothing_else(served: Served, tmp_path: Path) -> None:
    from llmgw_node.config import NodeConfig
    from llmgw_node.service import open_node_service

    seen: list[bytes] = []

    async def elsewhere(stream: trio.SocketStream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += await stream.receive_some(4096)
        seen.append(request)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")

    ws_url = served.agent_url.replace("http://", "ws://") + "/agent/v1"
    config = NodeConfig(control=[ws_url], node_id="n1", token=TOKEN, data_dir=str(tmp_path / "node"))
    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, elsewhere, 0, host="127.0.0.1"))
        other = f"http://127.0.0.1:{listener.socket.getsockname()[1]}/x"
        async with open_node_service(config) as svc:
            assert (await svc.client.get(served.agent_url + "/files/models/m.gguf")).content == DATA
            assert (await svc.client.get(other)).text == "ok"
        nursery.cancel_scope.cancel()
    assert seen and b"authorization" not in seen[0].lower()


async def test_a_generated_index_lists_the_cuda_runtimes_beside_the_builds(tmp_path: Path) -> None:
    from llmgw_control.fleet.files import FileServer

    engines = tmp_path / "engines"
    engines.mkdir()
    names = [
        "llama-b11312-bin-ubuntu-cuda-12.8-x64.tar.gz",
        "cudart-llama-b11312-bin-ubuntu-cuda-12.8-x64.tar.gz",
        "cudart-llama-b9999-bin-ubuntu-cuda-12.4-x64.tar.gz",
        "cudart-llama-bin-win-cuda-12.4-x64.zip",
        "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "nvidia_cublas-13.10.0.20-py3-none-manylinux_2_27_x86_64.whl",
        "numpy-2.0.0-py3-none-any.whl",
    ]
    for name in names:
        (engines / name).write_bytes(b"x")
    index = await FileServer(tmp_path, "http://control:8082").release("b11312")
    assert index is not None
    listed = {a["name"] for a in index["assets"]}
    assert listed == set(names) - {"cudart-llama-b9999-bin-ubuntu-cuda-12.4-x64.tar.gz", "numpy-2.0.0-py3-none-any.whl"}
