"""A real Prometheus (Debian's ``prometheus``) scrapes a live fleet; the dashboard's charts show its data.

Control, a node and the real engine run as processes; Prometheus scrapes the admin listener every
second. The test checks the fleet metrics control exports, that every series the alert rules
and charts use exists, and that the history page's charts (served through control's proxy of
``query_range``) draw what Prometheus recorded.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import trio

from llmgw_control.admin.dashboard.history import CHARTS
from llmgw_dev.build_engine import ensure_engine
from llmgw_dev.engine_proc import free_port
from support.fleet import Fleet, running_fleet
from support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def engine_archive(llama_server_binary: Path) -> Path:
    return ensure_engine()


@asynccontextmanager
async def running_prometheus(root: Path, port: int, target: str) -> AsyncIterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is missing: apt-get install -y prometheus")
    config = root / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: llmgw-control\n    static_configs:\n"
        f"      - targets: ['{target}']\n"
    )
    url = f"http://127.0.0.1:{port}"
    with open(root / "prometheus.log", "wb") as log:  # noqa: ASYNC230 -- a local file, opened once
        process = await trio.lowlevel.open_process(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={root / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        async with httpx2.AsyncClient(timeout=5) as client:

            async def ready() -> bool:
                try:
                    return (await client.get(url + "/-/ready")).status_code == 200
                except httpx2.TransportError:
                    return False

            await wait_until(ready, timeout=30, interval=0.2)
        yield url
    finally:
        with trio.CancelScope(shield=True):
            process.terminate()
            with trio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


def chat(fleet: Fleet, stream: bool) -> None:
    client = openai.OpenAI(base_url=fleet.api_url + "/v1", api_key="none", max_retries=0, timeout=120)
    answer = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=stream
    )
    if stream:
        # Streamed answers are what time to first token is measured on.
        for _ in answer:  # type: ignore[union-attr]
            pass


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def until(predicate: Any, timeout: float = 30) -> Any:
    return await wait_until(predicate, timeout=timeout, interval=0.5)


async def test_prometheus_scrapes_the_fleet_and_the_charts_show_it(
    tmp_path: Path, tiny_model: Path, engine_archive: Path
) -> None:
    prom_port = free_port()
    async with (
        running_fleet(
            tmp_path, tiny_model, engine_archive, monitoring={"prometheus": f"http://127.0.0.1:{prom_port}"}
        ) as fleet,
        running_prometheus(tmp_path, prom_port, f"127.0.0.1:{fleet.admin_port}") as prometheus,
    ):
        await fleet.add_node("n1")
        # Traffic spread over a few scrapes, so the rates are not zero.
        for i in range(4):
            await trio.to_thread.run_sync(chat, fleet, i % 2 == 1)
            await trio.sleep(1.5)

        async with httpx2.AsyncClient(base_url=fleet.admin_url, timeout=10) as admin:
            text = (await admin.get("/metrics")).text
            metrics = samples(text)
            assert metrics['llmgw_fleet_nodes{state="ready"}'] == 1
            assert metrics['llmgw_fleet_nodes{state="lost"}'] == 0
            assert metrics['llmgw_fleet_node_state{node="n1",state="ready"}'] == 1
            assert any(
                k.startswith("llmgw_fleet_engine_state{") and 'node="n1"' in k and 'status="installed"' in k
                for k in metrics
            )
            assert metrics['llmgw_fleet_replicas{model="tiny:cpu",state="ready"}'] == 1
            assert metrics['llmgw_fleet_node_ram_mib{kind="claimed",node="n1"}'] > 0
            assert metrics['llmgw_fleet_node_ram_mib{kind="free",node="n1"}'] == (
                metrics['llmgw_fleet_node_ram_mib{kind="usable",node="n1"}']
                - metrics['llmgw_fleet_node_ram_mib{kind="claimed",node="n1"}']
            )
            assert metrics['llmgw_fleet_node_replicas{node="n1"}'] == 1
            assert metrics["llmgw_fleet_queue_depth"] == 0
            assert metrics['llmgw_fleet_waiting_requests{model="tiny:cpu"}'] == 0
            assert metrics["llmgw_control_leader"] == 1
            assert any(k.startswith("llmgw_control_lease_info{") and 'holder=""' not in k for k in metrics)

            # Every series the alert rules and the charts read exists (a renamed metric would
            # otherwise leave an alert silently never firing).
            names = {re.sub(r"\{.*", "", k) for k in metrics}
            rules = (REPO / "examples" / "prometheus" / "llmgw-alerts.yml").read_text()
            used = set(re.findall(r"\bllmgw_\w+", rules + " ".join(c.query for c in CHARTS)))
            assert used - names == set()

            # Prometheus has the data...
            async with httpx2.AsyncClient(base_url=prometheus, timeout=10) as prom:

                async def scraped() -> bool:
                    body = (
                        await prom.get("/api/v1/query", params={"query": "sum(rate(llmgw_requests_total[1m]))"})
                    ).json()
                    result = body["data"]["result"]
                    if bool(result) and float(result[0]["value"][1]) > 0:
                        return True
                    # A Prometheus that started slowly (a loaded machine) first scraped after the
                    # traffic above: its counters are flat, the rate stays 0 until more arrives.
                    await trio.to_thread.run_sync(chat, fleet, False)
                    return False

                await until(scraped)

            # ...and control's proxy hands it to the page, as a line over time (a few steps of 5 s).
            async def line() -> Any:
                answer = (
                    await admin.get("/dashboard/history.json", params={"chart": "requests", "range": "300"})
                ).json()
                assert "series" in answer, answer
                labels = [s["label"] for s in answer["series"]]
                assert labels in ([], ["tiny:cpu"]), labels  # health checks (no model) are not charted
                values = [v for s in answer["series"] for _, v in s["points"] if v]
                if len(values) >= 3:
                    return answer
                await trio.to_thread.run_sync(chat, fleet, False)  # keep the rate up while steps fill
                return False

            await until(line, timeout=40)

            # Every chart the browser checks below has a drawn line in the proxy's answer first.
            # The page draws a series only if it has a point that is not a gap, and a quantile over
            # a window without requests is a gap: CI once failed with the TTFT series present but
            # all gaps, because only streams record a first token and the keep-up traffic was
            # non-streaming. So wait for a value, and keep streams going until it is there.
            for chart in ("tokens", "latency", "ttft"):

                async def charted(chart: str = chart) -> bool:
                    answer = (
                        await admin.get("/dashboard/history.json", params={"chart": chart, "range": "300"})
                    ).json()
                    if any(
                        v is not None
                        for s in answer.get("series", [])
                        if s["label"] == "tiny:cpu"
                        for _, v in s["points"]
                    ):
                        return True
                    await trio.to_thread.run_sync(chat, fleet, True)
                    return False

                await until(charted, timeout=60)
            replicas = (await admin.get("/dashboard/history.json", params={"chart": "replicas", "range": "300"})).json()
            assert "ready" in {s["label"] for s in replicas["series"]}
            refused = await admin.get("/dashboard/history.json", params={"chart": "up", "range": "300"})
            assert refused.status_code == 400

        await trio.to_thread.run_sync(_charts_in_the_browser, fleet)


def _charts_in_the_browser(fleet: Fleet) -> None:
    from control.dashboard.browser import artifacts, browser_context, require_chromium
    from playwright.sync_api import expect

    require_chromium()
    expect.set_options(timeout=20_000)
    with browser_context() as context:
        page = context.new_page()
        page.goto(fleet.admin_url + "/history")
        page.select_option("#history-range", "300")
        expect(page.locator('#chart-requests path[data-series="tiny:cpu"]')).to_have_count(1)
        expect(page.locator('#chart-tokens path[data-series="tiny:cpu"]')).to_have_count(1)
        expect(page.locator('#chart-latency path[data-series="tiny:cpu"]')).to_have_count(1)
        expect(page.locator('#chart-ttft path[data-series="tiny:cpu"]')).to_have_count(1)
        expect(page.locator('#chart-replicas path[data-series="ready"]')).to_have_count(1)
        expect(page.locator("#chart-requests .legend")).to_contain_text("tiny:cpu")
        # Over the 5-minute range the line has several points: a line over time, not a single dot.
        expect(page.locator('#chart-requests path[data-series="tiny:cpu"]')).to_have_attribute(
            "d", re.compile(r"^M[^L]+(L[^L]+){2,}$")
        )
        page.screenshot(path=artifacts("prometheus") / "history.png", full_page=True)
