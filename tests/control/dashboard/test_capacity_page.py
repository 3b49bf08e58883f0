"""The dashboard's capacity page in a real headless Chromium: two capacity runs of one profile (the
second against a replica made slower, as a worse engine build would be) drawn as charts of
throughput and latency against concurrency, side by side, with the regression flagged; a
threshold above the slowdown clears the flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from ..admin.conftest import Daemon, model_doc, running_control, wait_until
from ..admin.test_capacity_runs import CHUNK_DELAY, SWEEP, _async, engine_node, finished, settings
from .browser import artifacts, browser_context, require_chromium

# The second run's engine is this many times slower per token: generation drops by about half.
# Left out of the quick tier (slow: a real headless Chromium, seconds to start).
pytestmark = pytest.mark.slow


SLOWER = 2.0


def drive(admin_url: str, first: dict[str, Any], second: dict[str, Any]) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=20_000)
    shots = artifacts("capacity")
    with browser_context() as context:
        page = context.new_page()
        problems: list[str] = []
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(admin_url + "/capacity")
        expect(page.locator("nav a.current")).to_have_text("Capacity")
        expect(page.locator("#capacity-runs tbody tr")).to_have_count(2)
        expect(page.locator(f'#capacity-runs tr[data-run="{first["id"]}"]')).to_contain_text("done")
        # The defaults: B the newest run, A the one before it of the same profile.
        expect(page.locator("#run-b")).to_have_value(second["id"])
        expect(page.locator("#run-a")).to_have_value(first["id"])
        for role, run in (("A", first), ("B", second)):
            figure = page.locator(f'figure.run-chart[data-role="{role}"][data-run="{run["id"]}"]')
            expect(figure).to_contain_text("Throughput")
            expect(figure).to_contain_text("Latency")
            expect(figure).to_contain_text("Test CPU")
            # One line per series: generation and prompt; TTFT and ITL p50/p99.
            expect(figure.locator('div[data-chart="Throughput"] svg path')).to_have_count(2)
            expect(figure.locator('div[data-chart="Latency"] svg path')).to_have_count(4)
            expect(figure.locator('div[data-chart="Throughput"] svg circle')).to_have_count(2 * len(run["results"]))
        verdict = page.locator("#regression-verdict")
        expect(verdict).to_have_attribute("data-regression", "true")
        expect(verdict).to_contain_text("regression")
        expect(verdict).to_contain_text("generation")
        expect(page.locator("#comparison-table tbody tr.regression")).to_have_count(2)
        page.screenshot(path=str(shots / "regression.png"), full_page=True)
        # A threshold above the slowdown: no regression.
        page.fill("#regression-threshold", "1000")
        expect(verdict).to_have_attribute("data-regression", "false")
        expect(page.locator("#comparison-table tbody tr.regression")).to_have_count(0)
        # Swapped (the faster run as B) nothing is worse either way beyond 1000%.
        page.select_option("#run-a", second["id"])
        page.select_option("#run-b", first["id"])
        expect(page.locator('figure.run-chart[data-role="A"]')).to_have_attribute("data-run", second["id"])
        page.screenshot(path=str(shots / "swapped.png"), full_page=True)
        assert problems == [], problems


async def test_capacity_page_draws_runs_and_flags_a_regression(tmp_path: Path) -> None:
    require_chromium()
    model = model_doc(parallel=1, min_replicas=1)
    async with (
        running_control(tmp_path, models=[model], control_settings=settings()) as daemon,
        engine_node(daemon) as node,
    ):
        reconciler = daemon.fleet.reconciler
        await wait_until(lambda: _async(bool(reconciler.replicas.for_model("tiny:cpu"))))
        body = {**SWEEP, "levels": [1, 2]}
        first = await run_to_done(daemon, body)
        (engine,) = node.engines.values()
        engine.behavior.chunk_delay = CHUNK_DELAY * SLOWER
        second = await run_to_done(daemon, body)
        gen = (
            [lv["generation_tokens_per_s"] for lv in first["results"]],
            [lv["generation_tokens_per_s"] for lv in second["results"]],
        )
        assert all(b < a for a, b in zip(*gen, strict=True)), gen
        await trio.to_thread.run_sync(drive, daemon.admin_url, first, second)


async def run_to_done(daemon: Daemon, body: dict[str, Any]) -> dict[str, Any]:
    answer = await daemon.admin.post("/capacity/runs", json=body)
    assert answer.status_code == 202, answer.text
    run = await finished(daemon, answer.json()["run"]["id"])
    assert run["state"] == "done", run
    return run
