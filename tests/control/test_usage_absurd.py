"""An engine that reports absurd usage: the counts are clamped at the edge, quotas and the usage
flush go on (issue 29 §4). The parser itself is tested over arbitrary usage objects in
test_usage_bounds.py."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from llmgw_control.store import Store, StoreUnavailable, Usage, open_store
from llmgw_control.tenancy import UsageAccumulator
from llmgw_dev.fake_engine import FakeEngine
from support.gateway import chat_body, endpoint, running_gateway
from support.waiting import wait_until

T = datetime(2026, 12, 2, 10, 30, tzinfo=UTC).timestamp()


async def test_an_engine_reporting_10_to_the_20_prompt_tokens_locks_nobody_out(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.prompt_tokens = 10**20
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        service = gw.tenancy.service
        group = await service.create_group("acme")
        await service.set_quota(group.id, {"tokens_per_day": 1_000_000})
        created = await service.create_key(name="k", group_id=group.id)
        auth = {"authorization": f"Bearer {created.secret}"}
        fake_engine.behavior.chunks = 5
        for extra in ({}, {"stream": True, "stream_options": {"include_usage": True}}):
            answer = await gw.client.post("/v1/chat/completions", json=chat_body(max_tokens=5, **extra), headers=auth)
            assert answer.status_code == 200
            # The client still sees what the engine said; only what llmgw counts is bounded.
            assert str(10**20) in answer.text
        # The group is not locked out for the day: its budget took a plausible count.
        after = await gw.client.post("/v1/chat/completions", json=chat_body(max_tokens=5), headers=auth)
        assert after.status_code == 200

        # Each request settles just after its last byte is handed over: give the last one a moment.
        async def settled() -> bool:
            return (await service.usage_totals(group_id=group.id)).requests >= 3

        await wait_until(settled, timeout=3, interval=0.01)
        # And the flush writes it: before, the store refused the row ("too large") on every flush.
        await gw.tenancy.usage.flush(gw.tenancy.store)
        assert len(gw.tenancy.usage) == 0
        totals = await gw.tenancy.store.usage_totals(group_id=group.id)
        assert totals.requests == 3
        assert 0 < totals.prompt_tokens < 1_000_000
        # Each clamp is counted, by replica and field (and logged with the replica named).
        clamped = gw.registry.get_sample_value("llmgw_usage_clamped_total", {"replica": "e1", "field": "prompt_tokens"})
        assert clamped == 3


async def test_a_row_the_store_refuses_never_holds_back_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    usage = UsageAccumulator()
    usage.record(T, "k1", "g1", "m", 10, 5)
    usage.record(T, "k2", "g1", "m", 2**70, 5)  # no count reaches here since the gateway clamps
    usage.record(T, "k3", "g2", "m", 7, 1)
    async with open_store(tmp_path / "store.db") as store:
        with caplog.at_level(logging.ERROR, "llmgw_control.tenancy.usage"):
            assert await usage.flush(store) == 2
        assert len(usage) == 0  # the refused row is dropped, not retried on every flush
        rows = {u.key_id: (u.prompt_tokens, u.completion_tokens) for u in await store.query_usage()}
        assert rows == {"k1": (10, 5), "k3": (7, 1)}
        assert "k2" in caplog.text and "too large" in caplog.text
        # The next flush is an ordinary one.
        usage.record(T, "k1", "g1", "m", 1, 1)
        assert await usage.flush(store) == 1
        assert (await store.usage_totals()).prompt_tokens == 18


async def test_a_store_that_is_down_keeps_every_row_for_the_next_flush(tmp_path: Path) -> None:
    class Down:
        async def add_usage(self, deltas: Sequence[Usage]) -> None:
            raise StoreUnavailable("database went away")

    usage = UsageAccumulator()
    usage.record(T, "k1", "g1", "m", 10, 5)
    usage.record(T, "k2", "g1", "m", 2**70, 5)
    with pytest.raises(StoreUnavailable):
        await usage.flush(cast(Store, Down()))
    assert len(usage) == 2
