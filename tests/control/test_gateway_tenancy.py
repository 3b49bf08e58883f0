"""Keys and quotas on the data path, end to end through the gateway and the fake engine."""

from __future__ import annotations

import httpx2
import pytest
import trio

from llmgw_dev.fake_engine import FakeEngine
from support.gateway import chat_body, endpoint, running_gateway
from support.waiting import wait_until


async def test_open_until_a_key_exists_then_every_request_needs_one(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        assert (await gw.client.post("/v1/chat/completions", json=chat_body())).status_code == 200
        service = gw.tenancy.service
        group = await service.create_group("acme")
        created = await service.create_key(name="ci", group_id=group.id)
        assert created.secret.startswith("sk-llmgw-")
        missing = await gw.client.post("/v1/chat/completions", json=chat_body())
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
        # 401 comes before 404: no model names for a client without a key.
        unknown = await gw.client.post("/v1/chat/completions", json=chat_body(model="secret-model"))
        assert unknown.status_code == 401
        assert (await gw.client.get("/v1/models")).status_code == 401
        wrong = await gw.client.post(
            "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer sk-llmgw-nope"}
        )
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        auth = {"authorization": f"Bearer {created.secret}"}
        assert (await gw.client.post("/v1/chat/completions", json=chat_body(), headers=auth)).status_code == 200
        assert (await gw.client.get("/v1/models", headers=auth)).status_code == 200
        await service.revoke_key(created.key.id)
        revoked = await gw.client.post("/v1/chat/completions", json=chat_body(), headers=auth)
        assert revoked.status_code == 401 and revoked.json()["error"]["code"] == "api_key_revoked"


async def test_model_allow_list_gives_403(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url, "a", "b")) as gw:
        group = await gw.tenancy.service.create_group("acme")
        created = await gw.tenancy.service.create_key(name="only-a", group_id=group.id, models=["a"])
        auth = {"authorization": f"Bearer {created.secret}"}
        assert (await gw.client.post("/v1/chat/completions", json=chat_body("a"), headers=auth)).status_code == 200
        refused = await gw.client.post("/v1/chat/completions", json=chat_body("b"), headers=auth)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"


async def test_quota_on_a_parent_group_refuses_with_429_and_usage_is_settled(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.prompt_tokens = 10
    fake_engine.behavior.chunks = 5
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        service = gw.tenancy.service
        org = await service.create_group("org")
        team = await service.create_group("team", org.id)
        await service.set_quota(org.id, {"requests_per_minute": 3})
        created = await service.create_key(name="k", group_id=team.id)
        auth = {"authorization": f"Bearer {created.secret}"}
        for _ in range(3):
            ok = await gw.client.post("/v1/chat/completions", json=chat_body(max_tokens=5), headers=auth)
            assert ok.status_code == 200
        refused = await gw.client.post("/v1/chat/completions", json=chat_body(), headers=auth)
        assert refused.status_code == 429
        assert "org" in refused.json()["error"]["message"] and int(refused.headers["retry-after"]) >= 1
        assert len(fake_engine.observed.requests) == 3
        totals = await service.usage_totals(group_id=org.id, include_descendants=True)
        assert totals.prompt_tokens == 30 and totals.completion_tokens == 15


async def test_a_failed_request_gives_its_concurrency_slot_back(fake_engine: FakeEngine) -> None:
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        service = gw.tenancy.service
        group = await service.create_group("g")
        await service.set_quota(group.id, {"concurrent_requests": 1})
        created = await service.create_key(name="k", group_id=group.id)
        auth = {"authorization": f"Bearer {created.secret}"}
        fake_engine.behavior.status_before_body = 500
        for _ in range(3):
            failed = await gw.client.post("/v1/chat/completions", json=chat_body(), headers=auth)
            assert failed.status_code == 502
        fake_engine.behavior.status_before_body = None
        fake_engine.behavior.hang_mid_stream_after = 1
        async with trio.open_nursery() as nursery:

            async def hold() -> None:
                async with (
                    httpx2.AsyncClient(base_url=gw.url) as client,
                    client.stream(
                        "POST", "/v1/chat/completions", json=chat_body(stream=True), headers=auth
                    ) as response,
                ):
                    async for _ in response.aiter_bytes():
                        pass

            nursery.start_soon(hold)
            with trio.fail_after(5):
                await fake_engine.observed.wait_in_flight(1)
            busy = await gw.client.post("/v1/chat/completions", json=chat_body(), headers=auth)
            assert busy.status_code == 429 and "concurrent" in busy.json()["error"]["message"]
            nursery.cancel_scope.cancel()


@pytest.mark.slow  # left out of the quick tier: concurrent load
async def test_three_levels_under_concurrent_load_hold_and_count_exactly(fake_engine: FakeEngine) -> None:
    """Org, team and project limits at once, 60 concurrent clients, some engine failures."""
    fake_engine.behavior.prompt_tokens = 10
    fake_engine.behavior.chunks = 5  # 15 tokens per served request
    fake_engine.behavior.first_byte_delay = 0.05
    fake_engine.behavior.status_before_body = 500
    fake_engine.behavior.status_times = 6  # the first six fail: their reservations must come back
    async with running_gateway(endpoint("e1", fake_engine.url), max_attempts=1) as gw:
        service = gw.tenancy.service
        org = await service.create_group("org")
        team = await service.create_group("team", org.id)
        project = await service.create_group("project", team.id)
        await service.set_quota(org.id, {"tokens_per_minute": 20_000})
        await service.set_quota(team.id, {"requests_per_minute": 30})
        await service.set_quota(project.id, {"concurrent_requests": 4})
        created = await service.create_key(name="k", group_id=project.id)
        auth = {"authorization": f"Bearer {created.secret}"}
        statuses: list[int] = []

        async def client() -> None:
            async with httpx2.AsyncClient(base_url=gw.url, timeout=30) as http:
                for _ in range(3):
                    response = await http.post("/v1/chat/completions", json=chat_body(max_tokens=5), headers=auth)
                    statuses.append(response.status_code)
                    if response.status_code == 429:
                        await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            for _ in range(60):
                nursery.start_soon(client)
        served = statuses.count(200)
        assert statuses.count(502) == 6
        assert served + 6 <= 30  # the team's requests per minute, failures included
        assert served > 0 and statuses.count(429) == len(statuses) - served - 6
        assert fake_engine.observed.max_in_flight <= 4  # the project's concurrency

        # Each request settles just after its last byte is handed over: give the last ones a moment.
        # Totals are what was flushed to the store plus what is still pending in memory.
        async def settled() -> bool:
            return (await service.usage_totals(group_id=org.id, include_descendants=True)).requests >= served

        with trio.move_on_after(3):
            await wait_until(settled, timeout=4, interval=0.01)
        totals = await service.usage_totals(group_id=org.id, include_descendants=True)
        assert totals.requests == served  # failures are not usage
        assert totals.prompt_tokens == 10 * served  # settled once each
        assert totals.completion_tokens == 5 * served
        for budget in gw.tenancy.state.chain(project.id):
            assert budget.in_flight == 0 and budget.reserved == 0  # nothing left reserved
