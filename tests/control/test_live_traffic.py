"""The live traffic window (gateway/live.py): bounded whatever the fleet does, right figures, and
fed by every answered request through ``exchange.record`` (issue 34)."""

from __future__ import annotations

import json
import tracemalloc
from functools import partial

import attrs
import httpx2
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.documents import CONVERTER
from llmgw_control.gateway.demand import WaitingRequests
from llmgw_control.gateway.live import BUCKET_SECONDS, BUCKETS, MAX_SERIES, WINDOW_SECONDS, LiveWindow
from llmgw_dev.fake_engine import FakeEngine
from support.gateway import chat_body, endpoint, running_gateway
from support.waiting import wait_until

NOW = 1_700_000_000.0


def test_many_models_and_replicas_keep_the_window_bounded_dropping_the_least_recent() -> None:
    live = LiveWindow("test")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        # The worst case for memory: as many series as the cap, each with traffic in every bucket.
        for tick in range(BUCKETS):
            for i in range(MAX_SERIES // 2):
                live.note(f"m{i}", f"r{i}", 200, 0.2, 10, now=NOW + tick * BUCKET_SECONDS)
        # Then ten times more series than the cap, one after another.
        for i in range(MAX_SERIES * 10):
            live.note(f"new-m{i}", f"new-r{i}", 200, 0.2, 10, now=NOW + BUCKETS * BUCKET_SECONDS + i)
        grown = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert live.series_count() <= MAX_SERIES
    # Each series holds at most one ring, however much traffic went by.
    assert all(len(s.ring) == BUCKETS for s in [*live.models.values(), *live.replicas.values()])
    # Under 10 MiB at its peak, the figure docs/dashboard.md gives.
    assert grown < 10 * 1024 * 1024, grown
    # The newest series stayed; the least recent went.
    last = MAX_SERIES * 10 - 1
    assert f"new-m{last}" in live.models and f"new-r{last}" in live.replicas
    assert "m0" not in live.models and "new-m0" not in live.models


def test_a_series_used_recently_outlives_newer_ones_used_less_recently() -> None:
    live = LiveWindow("test", max_series=3)
    live.note("a", "", 200, None, 0, now=NOW)
    live.note("b", "", 200, None, 0, now=NOW + 10)
    live.note("a", "", 200, None, 0, now=NOW + 20)  # a is used again: b is now the least recent
    live.note("c", "", 200, None, 0, now=NOW + 30)
    live.note("d", "", 200, None, 0, now=NOW + 40)
    assert set(live.models) == {"a", "c", "d"}


def test_the_figures_per_bucket_and_over_the_last_minute() -> None:
    demand = WaitingRequests()
    demand.queued("m:cpu", 4)
    live = LiveWindow("test", queues=demand)
    for i in range(100):
        # Half the first-token times at 0.1 s, half at 1 s; 3 errors; 20 tokens each.
        live.note("m:cpu", "r1", 502 if i < 3 else 200, 0.1 if i % 2 else 1.0, 20, now=NOW + 55)
    live.note("m:cpu", "r2", 499, None, 0, now=NOW + 55)  # a client gone is not an error
    answer = live.read(now=NOW + 59)
    (model,) = answer.models
    assert model.name == "m:cpu" and answer.window_seconds == WINDOW_SECONDS
    # The last bucket of the window is the one the requests went in.
    assert answer.start == (int(NOW + 59) // 10 - BUCKETS + 1) * 10
    assert len(model.requests) == BUCKETS and sum(model.requests) == 101
    assert (model.requests[-1], model.errors[-1], model.completion_tokens[-1], model.queue_depth[-1]) == (
        101,
        3,
        2000,
        4,
    )
    p50, p95 = model.ttft_p50[-1], model.ttft_p95[-1]
    assert p50 is not None and 0.075 <= p50 <= 0.1
    assert p95 is not None and 0.75 <= p95 <= 1.0
    assert model.ttft_p50[0] is None
    recent = model.recent
    assert recent.requests_per_s == round(101 / 60, 3) and recent.tokens_per_s == round(2000 / 60, 2)
    assert recent.errors == 3 and recent.queue_depth == 4
    assert [r.name for r in answer.replicas] == ["r1", "r2"]
    assert answer.replicas[0].model == "m:cpu" and answer.replicas[0].requests[-1] == 100
    assert live.read("other", now=NOW + 59).models == []


def test_a_series_idle_for_the_whole_window_is_dropped_when_read() -> None:
    live = LiveWindow("test")
    live.note("old", "r-old", 200, None, 0, now=NOW)
    live.note("new", "", 200, None, 0, now=NOW + WINDOW_SECONDS)
    answer = live.read(now=NOW + WINDOW_SECONDS)
    assert [m.name for m in answer.models] == ["new"] and answer.replicas == []
    assert live.series_count() == 1


def test_a_queue_with_nothing_answered_still_shows_when_read() -> None:
    demand = WaitingRequests()
    demand.queued("stuck", 7)
    live = LiveWindow("test", queues=demand)
    (model,) = live.read(now=NOW).models
    assert model.recent.queue_depth == 7 and sum(model.requests) == 0


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=200), st.text(max_size=200))
def test_any_name_leaves_as_the_same_json_string(model: str, replica: str) -> None:
    live = LiveWindow("test")
    live.note(model, replica, 200, 0.5, 1, now=NOW)
    text = json.dumps(CONVERTER.unstructure(live.read(now=NOW)))
    back = json.loads(text)
    assert back["models"][0]["name"] == model
    if replica:
        assert back["replicas"][0]["name"] == replica


async def test_every_answered_request_lands_in_the_window_of_its_model_and_replica(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.chunks = 4
    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        for stream in (False, True, True):
            body = chat_body(stream=stream, stream_options={"include_usage": True}) if stream else chat_body()
            assert (await gw.client.post("/v1/chat/completions", json=body)).status_code == 200
        # An unknown model has no series (client input never names one).
        assert (await gw.client.post("/v1/chat/completions", json=chat_body("nope"))).status_code == 404
        async with httpx2.AsyncClient(base_url=gw.listening.admin_url + "/api/v1", timeout=10) as admin:
            answer = (await admin.get("/traffic")).json()
            assert (await admin.get("/traffic", params={"model": "nope"})).json()["models"] == []
            document = (await admin.get("/openapi.json")).json()
    assert "get" in document["paths"]["/api/v1/traffic"]
    assert answer["daemon"] and answer["bucket_seconds"] == BUCKET_SECONDS
    (model,) = answer["models"]
    assert model["name"] == "fake-model"
    assert sum(model["requests"]) == 3 and sum(model["completion_tokens"]) > 0
    # The two streams' first tokens.
    assert any(v is not None for v in model["ttft_p50"])
    assert [r["name"] for r in answer["replicas"]] == ["e1"]


def test_the_answer_is_plain_attrs() -> None:
    assert attrs.has(type(LiveWindow("x").read()))


async def test_requests_waiting_in_the_models_queue_show_as_its_queue_depth(fake_engine: FakeEngine) -> None:
    """The window reads the activator's own count of waiting requests (wired in app.py)."""
    fake_engine.behavior.first_byte_delay = 1.5
    async with running_gateway(endpoint("e1", fake_engine.url, slots=1)) as gw:
        async with httpx2.AsyncClient(base_url=gw.listening.admin_url + "/api/v1", timeout=10) as admin:
            depth = 0
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(partial(gw.client.post, "/v1/chat/completions", json=chat_body()))

                async def queued() -> int:
                    models = (await admin.get("/traffic")).json()["models"]
                    seen = int(models[0]["recent"]["queue_depth"]) if models else 0
                    return seen if seen >= 2 else 0

                with trio.move_on_after(5):
                    depth = await wait_until(queued, timeout=6)
            assert depth == 2
