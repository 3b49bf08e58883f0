"""Measured engine memory: RSS of a process tree from /proc, GPU memory from a scripted nvidia-smi."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_node import memory
from llmgw_shared.wire import MAX_MEMORY_MIB
from support.waiting import wait_until


def test_status_rss() -> None:
    assert memory.parse_status_rss_kib("Name:\tllama-server\nVmPeak:\t 999 kB\nVmRSS:\t  204800 kB\n") == 204800
    assert memory.parse_status_rss_kib("Name:\tkthreadd\nState:\tS\n") == 0
    assert memory.parse_status_rss_kib("VmRSS: lots kB\n") == 0


def test_session_from_stat_with_a_hostile_command_name() -> None:
    stat = "4242 (llama) server) (x) S 1 4242 4242 0 -1 4194560 " + " ".join(["0"] * 40)
    assert memory.parse_session(stat) == 4242
    assert memory.parse_session("garbage") is None
    assert memory.parse_session("1 (x) S 0") is None


def test_compute_apps_are_summed_per_pid_and_garbage_skipped() -> None:
    text = "4242, 1000\n4242, 500\n77, [N/A]\nWARNING: infoROM is corrupted\n-5, 10\n88, 99999999999999\n9, 20\n"
    assert memory.parse_compute_apps(text) == {4242: 1500, 9: 20}


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_any_nvidia_smi_output_parses_to_bounded_figures(text: str) -> None:
    used = memory.parse_compute_apps(text)
    assert all(pid > 0 and 0 <= mib <= MAX_MEMORY_MIB for pid, mib in used.items())


def _fake_proc(root: Path, pid: int, session: int, rss_kib: int) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "stat").write_text(f"{pid} (engine) S 1 {session} {session} 0 -1 " + "0 " * 40)
    (root / str(pid) / "status").write_text(f"Name:\tengine\nVmRSS:\t{rss_kib} kB\n")


def _fake_nvidia_smi(tmp_path: Path, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return bindir


async def test_tree_of_a_session_counts_its_children_and_their_gpu_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "proc"
    _fake_proc(root, 100, 100, 1024 * 300)  # the engine
    _fake_proc(root, 101, 100, 1024 * 200)  # a process it forked
    _fake_proc(root, 200, 200, 1024 * 900)  # someone else
    (root / "self").mkdir()
    bindir = _fake_nvidia_smi(
        tmp_path,
        """
case "$*" in
  *--query-compute-apps=pid,used_memory*--format=csv,noheader,nounits*)
    echo '100, 4000'; echo '101, 96'; echo '200, 7000'; echo '100, 1000' ;;
  *) echo "unexpected arguments: $*" >&2; exit 2 ;;
esac
""",
    )
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    assert await memory.measure([100], str(root)) == {100: (500, 5096)}


async def test_nvidia_smi_that_hangs_or_fails_costs_only_the_gpu_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = _fake_nvidia_smi(tmp_path, "exec sleep 30\n")
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    with trio.fail_after(5):
        assert await memory.gpu_use_by_pid(time_limit=0.3) == {}
    (bindir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert await memory.gpu_use_by_pid() == {}


async def test_a_real_process_tree_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi here
    # A parent holding ~64 MiB that forks a child holding ~32 MiB, in a session of its own.
    code = (
        "import os,time\nb=bytearray(64<<20)\nif os.fork()==0:\n c=bytearray(32<<20)\n time.sleep(30)\n"
        "print('ok',flush=True)\ntime.sleep(30)\n"
    )
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        with trio.fail_after(10):
            # A pipe may hand over "ok" and "\n" in two reads (seen on a loaded machine): read to 3 bytes.
            said = b""
            while len(said) < 3:
                chunk = await proc.stdout.receive_some(3 - len(said))
                assert chunk, f"the process closed its stdout after {said!r}"
                said += chunk
            assert said == b"ok\n"

        async def grown() -> tuple[int, int] | None:
            rss, vram = (await memory.measure([proc.pid]))[proc.pid]
            return (rss, vram) if rss >= 64 + 32 or vram else None

        rss, vram = await wait_until(grown, timeout=10)
        assert vram == 0 and 64 + 32 <= rss < 400
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
