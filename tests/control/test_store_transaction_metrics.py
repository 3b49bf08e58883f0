"""The daemon exposes ``llmgw_store_transactions_total`` on its admin /metrics, counting its writes."""

from __future__ import annotations

import httpx2

from support.gateway import running_gateway


def _scraped(text: str, kind: str) -> float:
    prefix = f'llmgw_store_transactions_total{{kind="{kind}"}} '
    values = [float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix)]
    assert len(values) == 1, text
    return values[0]


async def test_admin_metrics_count_the_store_transactions_of_an_admin_write() -> None:
    async with running_gateway() as gw, httpx2.AsyncClient(base_url=gw.listening.admin_url, timeout=30) as admin:
        before = (await admin.get("/metrics")).text
        created = await admin.post("/api/v1/groups", json={"name": "counted"})
        assert created.status_code == 201
        after = (await admin.get("/metrics")).text
        # At least the group's own write transaction (a reload of tenancy may read as well).
        assert _scraped(after, "write") >= _scraped(before, "write") + 1
        assert _scraped(after, "read") >= _scraped(before, "read")
