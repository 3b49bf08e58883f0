"""The worker-thread pools: one subsystem's stuck threads leave the others free, a full pool
refuses at once where asked, and no blocking call in the daemons escapes to trio's shared
default limiter."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from llmgw_shared.threads import HUB, POOLS, STORE, Busy, ThreadPool
from support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


async def test_a_full_pool_refuses_at_once_and_the_others_go_on() -> None:
    release = threading.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(HUB.size):
            nursery.start_soon(HUB.run, release.wait)
        await trio.testing.wait_all_tasks_blocked()
        assert HUB.limiter().available_tokens == 0
        with trio.fail_after(1), pytest.raises(Busy, match=f"all {HUB.size} hub threads"):
            await HUB.run_or_busy(lambda: None)
        with trio.fail_after(2):
            assert await STORE.run(lambda: 42) == 42
            assert await trio.to_thread.run_sync(lambda: 7) == 7  # trio's own limiter too
        release.set()
    assert HUB.limiter().available_tokens == HUB.size


async def test_an_abandoned_thread_keeps_its_token_until_it_ends() -> None:
    pool = ThreadPool("test-abandon", 1, "one thread, for this test")
    release = threading.Event()
    with trio.move_on_after(0.2):
        await pool.run(release.wait, abandon=True)
    assert pool.limiter().available_tokens == 0  # the thread still runs
    with pytest.raises(Busy):
        await pool.run_or_busy(lambda: None)
    release.set()
    await wait_until(lambda: pool.limiter().available_tokens != 0, timeout=2, interval=0.01)


def test_pools_are_named_once_and_sized() -> None:
    assert len({p.name for p in POOLS}) == len(POOLS)
    assert all(p.size >= 1 and p.reason for p in POOLS)


def test_no_blocking_call_runs_on_tries_shared_default_limiter() -> None:
    # A bare trio.to_thread.run_sync shares trio's 40 threads with every other such call: a
    # subsystem that stalls there starves the rest (issue 29). Each goes through a pool.
    found = []
    for package in ("llmgw_control", "llmgw_node", "shared"):
        for path in (ROOT / package / "src").rglob("*.py"):
            if path.name == "threads.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if "to_thread.run_sync" in line and "``" not in line:  # (not a docstring's mention)
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []
