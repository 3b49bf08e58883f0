"""Models added through the API survive a restart, on SQLite and on a real PostgreSQL; the config
file wins over a stored model of the same name; other daemons on the store follow changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_control.catalog import ModelConfig

from .conftest import fake_node, model_doc, running_control, wait_until


async def test_models_added_through_the_api_survive_a_restart(tmp_path: Path, store_url: str) -> None:
    async with running_control(tmp_path, store=store_url) as d:
        assert (await d.admin.post("/models", json=model_doc("tiny", min_replicas=1, context=512))).status_code == 201
        assert (await d.admin.post("/models", json=model_doc("gone"))).status_code == 201
        assert (await d.admin.delete("/models/gone")).status_code == 204
    async with running_control(tmp_path, store=store_url) as d:
        answer = (await d.admin.get("/models/tiny")).json()
        assert answer["source"] == "api" and answer["model"]["profiles"][0]["context"] == 512
        assert (await d.admin.get("/models/gone")).status_code == 404
        # Not only listed: the reconciler places it, as it would a model from the config file.
        async with fake_node(d, "n1"):

            async def placed() -> bool:
                return bool((await d.admin.get("/models")).json()["models"][0]["ready"])

            await wait_until(placed)


async def test_the_config_file_wins_over_a_stored_model_of_the_same_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_control(tmp_path) as d:
        assert (await d.admin.post("/models", json=model_doc("tiny", context=512))).status_code == 201
    async with running_control(tmp_path, models=[model_doc("tiny", context=1024)]) as d:
        answer = (await d.admin.get("/models/tiny")).json()
        assert answer["source"] == "config" and answer["model"]["profiles"][0]["context"] == 1024
        assert any("config file's definition is used" in r.getMessage() for r in caplog.records)
        assert [m.name for m in await d.tenancy.store.list_models()] == ["tiny"]  # kept, unused


async def test_a_stored_model_this_config_cannot_run_is_skipped_and_can_be_fixed_or_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_control(tmp_path) as d:
        # As if written by a daemon whose config had another engine.
        await d.tenancy.store.add_model("odd", {**model_doc("odd", engine="vllm")})
    async with running_control(tmp_path) as d:
        assert (await d.admin.get("/models")).json()["models"] == []
        assert any("odd" in r.getMessage() and "profiles[0].engine" in r.getMessage() for r in caplog.records)
        assert (await d.admin.delete("/models/odd")).status_code == 204
        assert await d.tenancy.store.list_models() == []


@pytest.mark.slow  # left out of the quick tier: two daemons on one store
async def test_another_daemon_on_the_same_store_follows_changes(tmp_path: Path, pg_url: str) -> None:
    store_url = pg_url
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        running_control(tmp_path / "a", store=store_url) as a,
        running_control(tmp_path / "b", store=store_url) as b,
    ):
        assert (await a.admin.post("/models", json=model_doc("tiny"))).status_code == 201
        await wait_until(lambda: "tiny" in b.fleet.catalog.models, timeout=10, interval=0.1)
        assert b.fleet.catalog.source("tiny") == "api"
        assert isinstance(b.fleet.catalog.models["tiny"], ModelConfig)
        assert (await a.admin.delete("/models/tiny")).status_code == 204
        await wait_until(lambda: "tiny" not in b.fleet.catalog.models, timeout=10, interval=0.1)
