"""``llmgw-control engines runtime``: NVIDIA's CUDA runtime wheels fetched by control against pinned
sha256s into ``<files_dir>/engines/``, and listed by the release index control generates.

Offline: a local HTTP server serves a fake wheel, and the pin table is replaced by one naming it.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw_control import cli
from llmgw_control.fleet import runtime_wheels
from llmgw_control.fleet.files import FileServer
from llmgw_control.fleet.runtime_wheels import PINS_FILE, RuntimeWheel
from llmgw_dev.cuda_wheels import CUDA12_X64

WHEEL = "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
DATA = b"PK fake wheel " * 100
BUILD = "llama-b11312-bin-ubuntu-cuda-12.8-x64.tar.gz"


class _Served:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        served = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

            def do_GET(self) -> None:
                served.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[_Served]:
    (tmp_path / "pypi").mkdir()
    (tmp_path / "pypi" / WHEEL).write_bytes(DATA)
    server = _Served(tmp_path / "pypi")
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.server.shutdown()
    thread.join(5)


def _pin(monkeypatch: pytest.MonkeyPatch, served: _Served, sha256: str) -> None:
    wheel = RuntimeWheel("nvidia-cuda-runtime-cu12", "12.8.90", WHEEL, f"{served.url}/{WHEEL}", sha256, len(DATA))
    monkeypatch.setattr(runtime_wheels, "PINNED", {(12, "x86_64"): (wheel,)})


def _run(files: Path, *extra: str) -> int:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["engines", "--files-dir", str(files), "runtime", "--cuda", "12", "--arch", "x86_64", *extra])
    return int(exit_.value.code or 0)


async def test_the_pinned_wheel_is_fetched_and_the_generated_index_lists_it_with_its_sha256(
    tmp_path: Path, served: _Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha256 = hashlib.sha256(DATA).hexdigest()
    _pin(monkeypatch, served, sha256)
    files = tmp_path / "files"
    assert _run(files) == 0
    engines = files / "engines"
    assert (engines / WHEEL).read_bytes() == DATA
    pins = json.loads((engines / PINS_FILE).read_text())
    assert pins["wheels"] == [
        {
            "file": WHEEL,
            "project": "nvidia-cuda-runtime-cu12",
            "version": "12.8.90",
            "sha256": sha256,
            "size": len(DATA),
            "cuda": 12,
            "arch": "x86_64",
        }
    ]
    (engines / BUILD).write_bytes(b"build")
    index = await FileServer(files, "http://control:8082").release("b11312")
    assert index is not None
    listed = {a["name"]: a for a in index["assets"]}
    assert listed[WHEEL]["digest"] == f"sha256:{sha256}"
    assert listed[WHEEL]["browser_download_url"] == f"http://control:8082/files/engines/{WHEEL}"
    assert set(listed) == {WHEEL, BUILD}  # the pins file is not an asset


def test_a_wheel_that_is_not_the_pinned_bytes_is_refused_and_nothing_is_left(
    tmp_path: Path, served: _Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _pin(monkeypatch, served, "0" * 64)
    files = tmp_path / "files"
    assert _run(files) == 1
    assert "is not the " + "0" * 64 in capsys.readouterr().err
    assert sorted(p.name for p in (files / "engines").iterdir()) == []  # no wheel, no .part, no pins


def test_a_mirror_serving_other_bytes_does_not_replace_a_good_file(
    tmp_path: Path, served: _Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    _pin(monkeypatch, served, hashlib.sha256(DATA).hexdigest())
    files = tmp_path / "files"
    assert _run(files) == 0
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / WHEEL).write_bytes(b"X" * len(DATA))
    (files / "engines" / WHEEL).write_bytes(b"damaged")
    assert _run(files, "--wheels-from", str(mirror)) == 1
    assert (files / "engines" / WHEEL).read_bytes() == b"damaged"
    assert _run(files, "--wheels-from", str(served.root)) == 0  # a good mirror repairs it
    assert (files / "engines" / WHEEL).read_bytes() == DATA


def test_a_second_run_fetches_nothing_and_changes_nothing(
    tmp_path: Path, served: _Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _pin(monkeypatch, served, hashlib.sha256(DATA).hexdigest())
    files = tmp_path / "files"
    assert _run(files) == 0
    assert len(served.requests) == 1
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (files / "engines").iterdir()}
    capsys.readouterr()
    assert _run(files) == 0
    assert len(served.requests) == 1
    assert "already there" in capsys.readouterr().err
    assert {
        p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (files / "engines").iterdir() if p.name != PINS_FILE
    } == {k: v for k, v in before.items() if k != PINS_FILE}
    assert (files / "engines" / PINS_FILE).read_bytes() == before[PINS_FILE][0]


async def test_the_index_leaves_out_a_pinned_wheel_whose_bytes_changed(
    tmp_path: Path, served: _Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    _pin(monkeypatch, served, hashlib.sha256(DATA).hexdigest())
    files = tmp_path / "files"
    assert _run(files) == 0
    (files / "engines" / BUILD).write_bytes(b"build")
    (files / "engines" / WHEEL).write_bytes(b"replaced")
    index = await FileServer(files, "http://control:8082").release("b11312")
    assert index is not None
    assert [a["name"] for a in index["assets"]] == [BUILD]


@pytest.mark.parametrize("text", [b"{", b"[" * 100_000, b'{"wheels": [1]}', b"x" * (2 << 20), b"\xff"])
async def test_an_unreadable_pins_file_leaves_the_index_as_computed(tmp_path: Path, text: bytes) -> None:
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / BUILD).write_bytes(b"build")
    (engines / WHEEL).write_bytes(DATA)
    (engines / PINS_FILE).write_bytes(text)
    index = await FileServer(tmp_path, "http://control:8082").release("b11312")
    assert index is not None
    assert {a["name"]: a["digest"] for a in index["assets"]}[WHEEL] == f"sha256:{hashlib.sha256(DATA).hexdigest()}"


def test_a_cuda_major_without_pins_is_refused_with_what_is_pinned(
    tmp_path: Path, served: _Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _pin(monkeypatch, served, hashlib.sha256(DATA).hexdigest())
    with pytest.raises(SystemExit) as exit_:
        cli.main(["engines", "--files-dir", str(tmp_path), "runtime", "--cuda", "13", "--arch", "x86_64"])
    assert exit_.value.code == 1
    assert (
        "no runtime wheels are pinned for CUDA 13 on x86_64 (pinned: --cuda 12 --arch x86_64)"
        in capsys.readouterr().err
    )
    assert served.requests == []


def test_cuda_13_takes_the_unsuffixed_wheels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(
            [
                "engines",
                "--files-dir",
                str(tmp_path),
                "runtime",
                "--cuda",
                "13",
                "--arch",
                "x86_64",
                "--wheels-from",
                str(tmp_path / "nowhere"),
            ]
        )
    assert exit_.value.code == 1
    assert "nvidia_cuda_runtime-13.4.92" in capsys.readouterr().err  # it tried the pinned file, from the mirror


def test_the_cuda_12_pins_are_the_wheels_the_node_tests_unpack() -> None:
    pinned = runtime_wheels.PINNED[(12, "x86_64")]
    assert [(w.project, w.filename, w.sha256) for w in pinned] == CUDA12_X64
    for (cuda, arch), wheels in runtime_wheels.PINNED.items():
        assert {w.project.removesuffix(f"-cu{cuda}") for w in wheels} == {"nvidia-cuda-runtime", "nvidia-cublas"}
        assert all(
            w.version.startswith(f"{cuda}.") and arch in w.filename and w.url.endswith("/" + w.filename) for w in wheels
        )
