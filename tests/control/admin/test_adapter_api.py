"""A profile's LoRA adapters through the admin API (issue 35): listed with the replicas that hold
them, added, rescaled and removed as model changes (stored, validated); hostile bodies are 400s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.admin.api.adapter_routes import AdapterBody, _check_body
from llmgw_control.admin.api.validate import structure_body
from llmgw_control.api_errors import AdminApiError
from llmgw_control.catalog import EngineConfig, ModelConfig, ProfileConfig, WeightsConfig, model_problems
from llmgw_control.catalog.models import AdapterConfig

from .conftest import Daemon, model_doc, running_control
from .test_ctl import ok, run

BOT = {"name": "bot", "url": "https://files.example/bot.gguf", "sha256": "b" * 64, "size": 4096}
PATH = "/models/tiny/profiles/cpu/adapters"


async def test_adapters_are_listed_added_rescaled_and_removed(daemon: Daemon) -> None:
    assert (await daemon.admin.post("/models", json=model_doc())).status_code == 201
    listed = (await daemon.admin.get(PATH)).json()
    assert listed == {"model": "tiny", "profile": "cpu", "engine": "llama.cpp", "live": False, "adapters": []}

    added = await daemon.admin.post(PATH, json=BOT)
    assert added.status_code == 201, added.text
    assert added.json() == {**BOT, "scale": 1.0, "loaded_on": []}
    # Stored as part of the model, and served as a model name of its own.
    stored = (await daemon.admin.get("/models/tiny")).json()["model"]["profiles"][0]["adapters"]
    assert stored == [{"name": "bot", "weights": {k: BOT[k] for k in ("url", "sha256", "size")}, "scale": 1.0}]
    assert daemon.fleet.catalog.resolve("bot") is not None

    again = await daemon.admin.post(PATH, json=BOT)
    assert again.status_code == 409 and again.json()["error"]["code"] == "name_taken"
    clash = await daemon.admin.post(PATH, json={**BOT, "name": "tiny"})  # the model's own name
    assert clash.status_code == 409, clash.text

    rescaled = await daemon.admin.patch(f"{PATH}/bot", json={"scale": 0.25})
    assert rescaled.status_code == 200 and rescaled.json()["scale"] == 0.25
    assert (await daemon.admin.get(PATH)).json()["adapters"][0]["scale"] == 0.25

    assert (await daemon.admin.delete(f"{PATH}/bot")).status_code == 204
    assert (await daemon.admin.get(PATH)).json()["adapters"] == []
    assert daemon.fleet.catalog.resolve("bot") is None
    assert (await daemon.admin.delete(f"{PATH}/bot")).status_code == 404
    assert (await daemon.admin.patch(f"{PATH}/bot", json={"scale": 1.0})).status_code == 404
    assert (await daemon.admin.get("/models/tiny/profiles/nope/adapters")).status_code == 404
    assert (await daemon.admin.get("/models/nope/profiles/cpu/adapters")).status_code == 404


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "a:b"}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x" * 97}, "name"),
        ({"sha256": "B" * 64}, "sha256"),
        ({"sha256": "b" * 63}, "sha256"),
        ({"size": 0}, "size"),
        ({"size": 65 << 30}, "size"),
        ({"size": "1"}, "size"),
        ({"url": "ftp://host/a.gguf"}, "url"),
        ({"url": "javascript:alert(1)"}, "url"),
        ({"url": ""}, "url"),
        ({"url": "relative/a.gguf"}, "url"),
        ({"url": "/a/../etc/passwd"}, "url"),
        ({"url": "/a\nb"}, "url"),
        ({"url": "https://h/" + "a" * 5000}, "url"),
        ({"scale": 0}, "scale"),
        ({"scale": -1}, "scale"),
        ({"scale": 17}, "scale"),
        ({"extra": 1}, "extra"),
    ],
)
async def test_hostile_adapter_bodies_are_400s_naming_the_field(
    daemon: Daemon, change: dict[str, Any], field: str
) -> None:
    assert (await daemon.admin.post("/models", json=model_doc())).status_code == 201
    answer = await daemon.admin.post(PATH, json={**BOT, **change})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field, answer.json()
    assert (await daemon.admin.get(PATH)).json()["adapters"] == []


async def test_a_vllm_adapter_is_a_directory_and_its_replicas_load_live(tmp_path: Path) -> None:
    vllm = {"engine": "vllm", "model_dir": "/models/qwen", "ram_mib": 100, "weights": None}
    async with running_control(tmp_path, control_settings={"engines": _engines()}) as d:
        assert (await d.admin.post("/models", json=model_doc(**vllm))).status_code == 201, "setup"
        listed = (await d.admin.get(PATH)).json()
        assert listed.get("live") is True, listed
        refused = await d.admin.post(PATH, json=BOT)
        assert refused.status_code == 400 and refused.json()["error"]["field"] == "url"
        added = await d.admin.post(PATH, json={**BOT, "url": "/adapters/bot"})
        assert added.status_code == 201, added.text


async def test_a_model_from_the_config_file_is_changed_there(tmp_path: Path) -> None:
    async with running_control(tmp_path, models=[model_doc()]) as d:
        answer = await d.admin.post(PATH, json=BOT)
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "defined_in_config"


@settings(max_examples=300, deadline=None)
@given(
    body=st.dictionaries(
        st.sampled_from(["name", "url", "sha256", "size", "scale", "x"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(max_size=40),
            st.lists(st.integers(), max_size=3),
            st.just("b" * 64),
            st.just("/a/b.gguf"),
        ),
        max_size=6,
    ),
    engine=st.sampled_from(["llama.cpp", "vllm"]),
)
def test_any_body_is_an_adapter_or_a_400(body: dict[str, Any], engine: str) -> None:
    """The edge's two checks (the schema, then where the weights may be) refuse with a 400 and
    nothing else; what passes them is a valid adapter for the catalog."""
    profile = ProfileConfig(name="cpu", engine=engine, weights=WeightsConfig("/m.gguf", "a" * 64, 1))
    try:
        adapter = structure_body(body, AdapterBody)
        _check_body(adapter, profile)
    except AdminApiError as exc:
        assert exc.status == 400
        return
    checked = attrs.evolve(
        profile,
        adapters=[AdapterConfig(adapter.name, WeightsConfig(adapter.url, adapter.sha256, adapter.size), adapter.scale)],
    )
    assert (
        model_problems(ModelConfig("m", [checked]), [EngineConfig("llama.cpp", "b1"), EngineConfig("vllm", "0.9.1")])
        == []
    ), body


def _engines() -> list[EngineConfig]:
    return [EngineConfig("llama.cpp", "b1"), EngineConfig("vllm", "0.9.1")]


async def test_ctl_adapters_use_the_adapter_routes(daemon: Daemon) -> None:
    assert (await daemon.admin.post("/models", json=model_doc())).status_code == 201
    added = await ok(
        daemon,
        "models",
        "adapters",
        "add",
        "tiny",
        "bot",
        "--url",
        BOT["url"],
        "--sha256",
        BOT["sha256"],
        "--size",
        str(BOT["size"]),
        "--scale",
        "0.5",
    )
    assert "adapter bot added to tiny" in added.out
    listed = await ok(daemon, "models", "adapters", "list", "tiny")
    assert listed.out.splitlines()[0].split() == ["ADAPTER", "BYTES", "SCALE", "LOADED", "ON", "URL"]
    assert listed.out.splitlines()[1].split() == ["bot", "4096", "0.5", "-", BOT["url"]]
    await ok(daemon, "models", "adapters", "scale", "tiny", "bot", "2", "--profile", "cpu")
    answer = (await ok(daemon, "--json", "models", "adapters", "list", "tiny")).json()
    assert answer["adapters"][0]["scale"] == 2.0
    await ok(daemon, "models", "adapters", "remove", "tiny", "bot")
    assert (await daemon.admin.get(PATH)).json()["adapters"] == []
    gone = await run(daemon, "models", "adapters", "remove", "tiny", "bot")
    assert gone.code == 1 and "adapter 'bot' not found (HTTP 404)" in gone.err
    bad = await run(
        daemon,
        "models",
        "adapters",
        "add",
        "tiny",
        "a:b",
        "--url",
        BOT["url"],
        "--sha256",
        BOT["sha256"],
        "--size",
        "1",
    )
    assert bad.code == 1 and "HTTP 400" in bad.err
