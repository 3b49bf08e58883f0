"""Prefix routing through the gateway, on fake engines: conversations stay put, the load bound
spreads a hot key, hostile keys are only keys, and the options are validated at start."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
import trio

from llmgw_control.config import ControlConfig, validate
from llmgw_control.gateway.config import GatewayConfig
from llmgw_dev.fake_engine import FakeEngineBehavior, run_fake_engine
from llmgw_shared.config import ConfigError
from support.gateway import endpoint, running_gateway
from support.waiting import wait_until

SYSTEM = {"role": "system", "content": "You answer in one word. " * 20}


async def test_every_turn_of_a_conversation_lands_on_one_replica() -> None:
    async with run_fake_engine() as a, run_fake_engine() as b, run_fake_engine() as c:
        async with running_gateway(
            endpoint("a", a.url), endpoint("b", b.url), endpoint("c", c.url), routing="prefix"
        ) as gw:
            homes: dict[int, set[str]] = {}
            for turn in range(3):
                for number in range(10):
                    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": f"Question {number}"}]
                    for earlier in range(turn):
                        messages += [
                            {"role": "assistant", "content": "Yes."},
                            {"role": "user", "content": f"Follow-up {earlier}"},
                        ]
                    response = await gw.client.post(
                        "/v1/chat/completions", json={"model": "fake-model", "messages": messages}
                    )
                    assert response.status_code == 200
                    homes.setdefault(number, set()).add(response.headers["x-llmgw-replica"])
            assert all(len(replicas) == 1 for replicas in homes.values())
            # Ten conversations are spread, not piled on one replica.
            assert len(set().union(*homes.values())) > 1
            assert gw.metric("llmgw_affinity_requests_total", {"model": "fake-model", "outcome": "hit"}) == 30


async def test_least_loaded_routing_counts_no_affinity() -> None:
    async with run_fake_engine() as a, run_fake_engine() as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url), routing="least-loaded") as gw:
            response = await gw.client.post(
                "/v1/chat/completions",
                json={"model": "fake-model", "messages": [SYSTEM, {"role": "user", "content": "hi"}]},
            )
            assert response.status_code == 200
            assert gw.metric("llmgw_affinity_requests_total", {"model": "fake-model", "outcome": "hit"}) == 0


async def _open_stream(url: str, session: str) -> None:
    async with httpx2.AsyncClient(base_url=url) as client:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": True}
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"x-session-id": session}
        ) as response:
            async for _ in response.aiter_bytes():
                pass


async def test_a_hot_session_is_spread_once_its_replica_passes_the_load_bound() -> None:
    behavior = FakeEngineBehavior(hang_mid_stream_after=1)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(
            endpoint("a", a.url), endpoint("b", b.url), routing="prefix", affinity_load_factor=0.25
        ) as gw:
            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(_open_stream, gw.url, "one-hot-session")
                await wait_until(lambda: a.observed.in_flight + b.observed.in_flight >= 6, timeout=10, interval=0.01)
                # A replica holds at most (1 + 0.25) x 3 + 1 = 4.75, so 4; the rest go to the other.
                assert sorted([a.observed.in_flight, b.observed.in_flight]) == [2, 4]
                labels = {"model": "fake-model"}
                # The first opens the session (new, on the least loaded); the one that passes the
                # bound moves it (a miss), and the session follows to where it moved.
                assert gw.metric("llmgw_affinity_requests_total", {**labels, "outcome": "hit"}) == 5
                assert gw.metric("llmgw_affinity_requests_total", {**labels, "outcome": "miss"}) == 1
                assert gw.metric("llmgw_affinity_new_conversations_total", labels) == 1
                nursery.cancel_scope.cancel()


async def _open_conversation(url: str, question: str, opened: dict[str, str]) -> None:
    async with httpx2.AsyncClient(base_url=url) as client:
        body = {"model": "fake-model", "messages": [SYSTEM, {"role": "user", "content": question}], "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            opened[question] = response.headers["x-llmgw-replica"]
            async for _ in response.aiter_bytes():
                pass


async def test_new_conversations_are_spread_evenly_and_their_next_turns_follow() -> None:
    """Twelve conversations open one after another and stay in flight: each goes to the least
    loaded replica (6 and 6), not where its hash points within the load bound (which allows 8 and
    4 at twelve). Their next turns then go back to where they opened."""
    behavior = FakeEngineBehavior(hang_mid_stream_after=1)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url), routing="prefix") as gw:
            opened: dict[str, str] = {}
            async with trio.open_nursery() as nursery:
                for number in range(12):
                    nursery.start_soon(_open_conversation, gw.url, f"Question {number}", opened)
                    await wait_until(
                        lambda n=number: a.observed.in_flight + b.observed.in_flight >= n + 1,
                        timeout=10,
                        interval=0.005,
                    )
                await wait_until(lambda: len(opened) >= 12, timeout=10, interval=0.005)
                assert [a.observed.in_flight, b.observed.in_flight] == [6, 6]
                labels = {"model": "fake-model"}
                assert gw.metric("llmgw_affinity_new_conversations_total", labels) == 12
                nursery.cancel_scope.cancel()
            homes: dict[str, str] = {}
            for number in range(12):
                messages = [
                    SYSTEM,
                    {"role": "user", "content": f"Question {number}"},
                    {"role": "assistant", "content": "Yes."},
                    {"role": "user", "content": "Go on."},
                ]
                response = await gw.client.post(
                    "/v1/chat/completions", json={"model": "fake-model", "messages": messages}
                )
                assert response.status_code == 200
                homes[f"Question {number}"] = response.headers["x-llmgw-replica"]
            assert homes == opened
            assert gw.metric("llmgw_affinity_requests_total", {**labels, "outcome": "hit"}) == 24


async def test_the_default_is_prefix_and_identical_first_turns_still_spread_by_load() -> None:
    """Six identical first turns at once (no session): they share nothing in flight, so they are
    spread 3 and 3 as least-loaded would, not piled within the bound (4 and 2) as one hot key."""
    assert GatewayConfig().routing == "prefix"
    behavior = FakeEngineBehavior(hang_mid_stream_after=1)
    async with run_fake_engine(behavior) as a, run_fake_engine(behavior) as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url)) as gw:
            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(_open_conversation, gw.url, "The same question", {})
                await wait_until(lambda: a.observed.in_flight + b.observed.in_flight >= 6, timeout=10, interval=0.005)
                assert [a.observed.in_flight, b.observed.in_flight] == [3, 3]
                nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "hi"}], "user": "u" * 1_000_000},
        {"messages": [{"role": "system", "content": "s" * 2_000_000}, {"role": "user", "content": "hi"}]},
        {"messages": [{"role": {"nested": ["x"]}, "content": [{"type": "text", "text": 5}, 7, None]}]},
        {"messages": [{"role": "system", "content": "s"}] * 20_000 + [{"role": "user", "content": "hi"}]},
        {"prompt": ["a" * 100_000, 5, None], "_path": "/v1/completions"},
        {"prompt": [1, 2, True, -5], "_path": "/v1/completions"},
    ],
)
async def test_hostile_keys_are_only_keys(body: dict[str, Any]) -> None:
    async with run_fake_engine() as a, run_fake_engine() as b:
        async with running_gateway(endpoint("a", a.url), endpoint("b", b.url), routing="prefix") as gw:
            path = body.pop("_path", "/v1/chat/completions")
            response = await gw.client.post(
                path, json={"model": "fake-model", **body}, headers={b"x-session-id": ("\u00e9" * 2000).encode()}
            )
            # Served, or refused by the request's own validation: never a server error.
            assert response.status_code < 500, response.text
            if response.status_code >= 400:
                assert set(response.json()["error"]) >= {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("router", "named"),
    [
        ({"routing": "sticky"}, "router.routing"),
        ({"routing": ""}, "router.routing"),
        ({"affinity_load_factor": -0.1}, "router.affinity_load_factor"),
        ({"affinity_load_factor": float("nan")}, "router.affinity_load_factor"),
        ({"affinity_load_factor": 11.0}, "router.affinity_load_factor"),
    ],
)
def test_routing_options_are_validated_by_name(router: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        validate(ControlConfig(router=GatewayConfig(**router)))
