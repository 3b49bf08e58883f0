"""Process hygiene of the proofs: ``--version`` and ``ldd`` run in their own session, and whatever
they leave behind dies with them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from llmgw_node.engines.proof import ProofError, engine_version, run_probe
from llmgw_node.procs import start_ticks
from support.waiting import wait_until


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "engine"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


async def _gone(pid: int) -> None:
    # Killed is at once; reaped (by init, its parent being gone) may take a moment.
    await wait_until(lambda: start_ticks(pid) is None, timeout=10, interval=0.02)


async def test_a_child_holding_the_output_is_refused_and_killed(tmp_path: Path) -> None:
    # Prints, exits 0, and leaves a child with stdout open: the probe never sees the end of it.
    script = _script(tmp_path, f"sleep 300 &\necho $! > {tmp_path}/child\necho 'version: 1'\nexit 0\n")
    with pytest.raises(ProofError, match=r"engine --version did not finish within 0\.5 s"):
        await engine_version(script, time_limit=0.5)
    await _gone(int((tmp_path / "child").read_text()))


async def test_a_child_that_let_go_of_the_output_is_killed_all_the_same(tmp_path: Path) -> None:
    script = _script(
        tmp_path, f"sleep 300 >/dev/null 2>&1 &\necho $! > {tmp_path}/child\necho 'version: 2 (build 2)'\n"
    )
    assert await engine_version(script, time_limit=10) == "version: 2 (build 2)"
    await _gone(int((tmp_path / "child").read_text()))


async def test_a_probe_runs_in_its_own_session(tmp_path: Path) -> None:
    script = _script(tmp_path, "ps -o sid= -p $$; echo $$\n")
    code, out, _ = await run_probe([str(script)], time_limit=10)
    sid, pid = out.split()
    assert code == 0 and sid == pid and int(sid) != os.getsid(0)


async def test_endless_output_is_bounded_and_cut_off(tmp_path: Path) -> None:
    script = _script(tmp_path, "yes 'version: spam'\n")
    with pytest.raises(ProofError, match="did not finish within"):
        await engine_version(script, time_limit=0.5)


async def test_a_hanging_probe_is_killed_with_its_group(tmp_path: Path) -> None:
    script = _script(tmp_path, f"sleep 300 &\necho $! > {tmp_path}/child\nwait\n")
    with pytest.raises(trio.TooSlowError):
        await run_probe([str(script)], time_limit=0.5)
    await _gone(int((tmp_path / "child").read_text()))
