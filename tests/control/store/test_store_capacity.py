"""Capacity records (benchmark results)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from llmgw_control.store import InvalidInput, NotFound, SqlStore

T0 = datetime(2026, 12, 1, 9, 30, 15, 250000, tzinfo=UTC)


async def _add(store: SqlStore, **overrides: object) -> object:
    fields: dict[str, object] = {
        "model": "qwen",
        "profile": "default",
        "node_id": "n1",
        "engine": "llama.cpp-b11312",
        "concurrency": 4,
        "tokens_per_s": 123.5,
        "ttft_p50_s": 0.12,
        "ttft_p99_s": 0.9,
        "measured_at": T0,
        "detail": {"prompt_tokens": 512, "runs": [1, 2]},
    }
    fields.update(overrides)
    return await store.add_capacity(**fields)  # type: ignore[arg-type]


async def test_add_list_filter_delete(store: SqlStore) -> None:
    first = await _add(store)
    second = await _add(store, node_id="n2", measured_at=T0 + timedelta(hours=1), detail=None)
    records = await store.list_capacity(model="qwen")
    assert records == [second, first]  # newest first
    assert records[1].tokens_per_s == 123.5 and records[1].measured_at == T0
    assert records[1].detail == {"prompt_tokens": 512, "runs": [1, 2]}
    assert records[0].detail == {}
    assert await store.list_capacity(node_id="n1") == [first]
    assert await store.list_capacity(model="other") == []
    await store.delete_capacity(records[0].id)
    assert await store.list_capacity() == [first]
    with pytest.raises(NotFound):
        await store.delete_capacity(records[0].id)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("concurrency", 0),
        ("tokens_per_s", float("inf")),
        ("ttft_p50_s", -1.0),
        ("ttft_p99_s", "fast"),
        ("measured_at", "2026-12-01"),
        ("detail", [1, 2]),
        ("engine", ""),
    ],
)
async def test_bad_input(store: SqlStore, field: str, value: object) -> None:
    with pytest.raises(InvalidInput) as info:
        await _add(store, **{field: value})
    assert info.value.field == field
    assert await store.list_capacity() == []


async def test_capacity_runs_add_update_list(store: SqlStore) -> None:
    run = await store.add_capacity_run(
        model="qwen", profile="default", node_id="", kind="", state="queued", document={"levels": [1, 2]}
    )
    assert run.state == "queued" and run.document == {"levels": [1, 2]}
    done = await store.update_capacity_run(
        run.id,
        state="done",
        document={"levels": [1, 2], "results": [{"c": 1}]},
        node_id="n1",
        kind="cpu|gpu|llama.cpp b1",
    )
    assert (done.state, done.node_id, done.kind) == ("done", "n1", "cpu|gpu|llama.cpp b1")
    assert await store.get_capacity_run(run.id) == done
    other = await store.add_capacity_run(
        model="qwen", profile="fast", node_id="n2", kind="k", state="running", document={}
    )
    assert [r.id for r in await store.list_capacity_runs(model="qwen", state="done")] == [run.id]
    assert {r.id for r in await store.list_capacity_runs()} == {run.id, other.id}
    assert len(await store.list_capacity_runs(limit=1)) == 1
    with pytest.raises(InvalidInput):
        await store.update_capacity_run(run.id, state="exploded", document={})
    with pytest.raises(NotFound):
        await store.get_capacity_run("missing")
