"""LoRA adapters in the catalog and ctl (issue 35): validated at the edge, one meaning per name."""

from __future__ import annotations

import attrs

from llmgw_control.catalog.claims import claims_of
from llmgw_control.catalog.models import (
    AdapterConfig,
    Catalog,
    Claim,
    EngineConfig,
    ModelConfig,
    ProfileConfig,
    WeightsConfig,
    model_problems,
    name_clash,
)
from llmgw_control.catalog.service import _restart_needed
from llmgw_control.fleet.lifecycle import ReplicaStatus
from llmgw_control.fleet.live_adapters import LiveAdapters, adapter_specs
from llmgw_control.fleet.replica_records import ReplicaRecord
from llmgw_control.gateway.adapters import adapter_fields, replica_adapters, without_adapter
from llmgw_control.gateway.replicas import Replica

ENGINES = [EngineConfig(name="llama.cpp", version="b11312"), EngineConfig(name="vllm", version="0.9")]
W = WeightsConfig("http://files/m.gguf", "a" * 64, 100)


def _model(name: str = "qwen", *adapters: AdapterConfig, engine: str = "llama.cpp") -> ModelConfig:
    profile = ProfileConfig(name="gpu", weights=W, engine=engine, adapters=list(adapters))
    if engine == "vllm":
        profile = attrs.evolve(profile, weights=None, model_dir="/models/qwen", ram_mib=100)
    return ModelConfig(name, [profile])


def test_adapters_are_validated_like_weights() -> None:
    good = AdapterConfig("bot", WeightsConfig("http://files/bot.gguf", "b" * 64, 10))
    assert model_problems(_model("qwen", good), ENGINES) == []
    fields = {
        f
        for f, _ in model_problems(
            _model("qwen", attrs.evolve(good, name="a:b", weights=WeightsConfig("", "B" * 64, 0), scale=float("nan"))),
            ENGINES,
        )
    }
    assert fields == {
        "profiles[0].adapters[0].name",
        "profiles[0].adapters[0].weights.url",
        "profiles[0].adapters[0].weights.sha256",
        "profiles[0].adapters[0].weights.size",
        "profiles[0].adapters[0].scale",
    }
    assert model_problems(_model("qwen", good, good), ENGINES)[0][1] == "two adapters share a name"
    sglang = ModelConfig("s", [ProfileConfig(name="p", engine="sglang", model_dir="/m", ram_mib=1, adapters=[good])])
    assert any(f == "profiles[0].adapters" for f, _ in model_problems(sglang, [*ENGINES, EngineConfig("sglang")]))


def test_an_adapter_name_means_one_thing() -> None:
    bot = AdapterConfig("bot", W)
    assert "named like the model 'bot'" in name_clash(_model("qwen", bot), [ModelConfig("bot", [])])
    assert name_clash(_model("llama", bot), [_model("qwen", bot)])
    assert name_clash(_model("qwen", AdapterConfig("qwen", W)), [])
    assert name_clash(_model("qwen", bot), [_model("qwen", bot)]) == ""  # itself, replaced


def test_the_catalog_resolves_an_adapter_to_its_base_key() -> None:
    catalog = Catalog([_model("qwen", AdapterConfig("bot", W, scale=0.5))], ENGINES)
    resolved = catalog.resolve("bot")
    assert resolved is not None and resolved.profile_key == "qwen:gpu" and resolved.name == "bot"
    assert catalog.resolve("qwen") is not None and catalog.resolve("qwen").name == "qwen"  # type: ignore[union-attr]
    assert catalog.resolve("bot:gpu") is None
    assert "bot" in catalog.names()


def test_the_engine_body_selects_exactly_the_asked_adapter() -> None:
    profile = _model("qwen", AdapterConfig("a", W), AdapterConfig("b", W, scale=0.5)).profiles[0]
    adapters, mode = replica_adapters(profile, ["a", "b"])
    replica = Replica(id="r", url="http://e", models=frozenset({"qwen:gpu"}), adapters=adapters, adapter_mode=mode)
    hostile = {"lora": [{"id": 0, "scale": 9}]}
    assert adapter_fields(replica, "b", hostile) == {"lora": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}]}
    assert adapter_fields(replica, "qwen", {}) == {"lora": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]}
    vllm_profile = _model("qwen", AdapterConfig("a", W), AdapterConfig("b", W), engine="vllm").profiles[0]
    vllm = Replica(
        id="v",
        url="http://e",
        models=frozenset({"qwen:gpu"}),
        **dict(zip(("adapters", "adapter_mode"), replica_adapters(vllm_profile, ["a"]), strict=True)),
    )
    assert adapter_fields(vllm, "a", hostile) == {"model": "a"}
    assert adapter_fields(vllm, "qwen", hostile) == {}  # the client's lora is dropped
    # A vLLM replica holds what its node loaded ("b" failed, or is still loading): "b"'s requests
    # never reach it, the base's and "a"'s do.
    assert vllm.adapters == (("a", 1.0),)
    assert without_adapter([vllm, replica], "b") == {"v"} and without_adapter([vllm, replica], "a") == set()
    # A llama-server whose node refused "a" (a wrong sha256) was started with "b" alone: "b" is its
    # lora id 0, and "a"'s requests never reach it.
    partial, mode = replica_adapters(profile, ["b"])
    refused = Replica(id="p", url="http://e", models=frozenset({"qwen:gpu"}), adapters=partial, adapter_mode=mode)
    assert adapter_fields(refused, "b", hostile) == {"lora": [{"id": 0, "scale": 0.5}]}
    assert without_adapter([refused, replica], "a") == {"p"}
    assert without_adapter([vllm, replica], None) == set()
    plain = Replica(id="p", url="http://e", models=frozenset({"m"}))
    assert adapter_fields(plain, "m", {}) is None and adapter_fields(plain, "m", hostile) == {}


def test_llama_cpp_replicas_restart_for_a_new_adapter_vllm_ones_only_for_their_first() -> None:
    bot = AdapterConfig("bot", W)
    assert _restart_needed(_model("q").profiles[0], _model("q", bot).profiles[0])
    assert not _restart_needed(
        _model("q", bot).profiles[0], _model("q", attrs.evolve(bot, name="renamed", scale=2.0)).profiles[0]
    )
    # vLLM loads and unloads live once it runs with --enable-lora, which a profile without
    # adapters did not start with: its first adapter restarts it, later changes do not.
    two = AdapterConfig("two", attrs.evolve(W, sha256="b" * 64))
    assert _restart_needed(_model("q", engine="vllm").profiles[0], _model("q", bot, engine="vllm").profiles[0])
    assert not _restart_needed(
        _model("q", bot, engine="vllm").profiles[0], _model("q", bot, two, engine="vllm").profiles[0]
    )
    assert not _restart_needed(
        _model("q", bot, two, engine="vllm").profiles[0], _model("q", two, engine="vllm").profiles[0]
    )
    assert not _restart_needed(_model("q", two, engine="vllm").profiles[0], _model("q", engine="vllm").profiles[0])


async def test_a_profiles_claim_adds_its_adapters_weights_where_its_model_is() -> None:
    mib = 1 << 20
    small = AdapterConfig("small", WeightsConfig("http://files/s.gguf", "c" * 64, 1))  # a byte: a whole MiB
    big = AdapterConfig("big", WeightsConfig("http://files/b.gguf", "d" * 64, 300 * mib))
    cpu = attrs.evolve(_model("q", small, big).profiles[0], ram_mib=1000)
    gpu = attrs.evolve(cpu, name="cuda", vram_mib=5000)
    vllm = _model("v", big, engine="vllm").profiles[0]
    claims = await claims_of(
        [("q:cpu", cpu), ("q:cuda", gpu), ("v:gpu", vllm), ("bare:cpu", attrs.evolve(cpu, adapters=[]))], None
    )
    assert claims["q:cpu"] == Claim(1000 + 1 + 300)  # in RAM, with the model
    assert claims["q:cuda"] == Claim(1000, 5000 + 301)  # on the GPU, with the model
    assert claims["v:gpu"] == Claim(100 + 300)
    assert claims["bare:cpu"] == Claim(1000)


def test_a_vllm_adapter_replaced_under_its_name_is_sent_again() -> None:
    first = _model("qwen", AdapterConfig("a", WeightsConfig("/models/a-v1", "a" * 64, 64)), engine="vllm")
    replaced = _model("qwen", AdapterConfig("a", WeightsConfig("/models/a-v2", "b" * 64, 64)), engine="vllm")
    record = ReplicaRecord(
        "r1", "qwen:gpu", "n1", 8000, Claim(ram_mib=100), status=ReplicaStatus.READY, adapters=("a",)
    )
    live = LiveAdapters()
    live.sent_to("r1", adapter_specs(first.profiles[0]))  # as the start does
    assert live.due([record], Catalog([first], ENGINES)) == []
    due = live.due([record], Catalog([replaced], ENGINES))
    assert [(r.replica_id, [a.weights.url for a in specs]) for r, specs in due] == [("r1", ["/models/a-v2"])]
    live.sent_to("r1", due[0][1])
    assert live.due([record], Catalog([replaced], ENGINES)) == []
    # Adopted by a daemon that never sent it a list: its loaded names are all there is to compare.
    assert LiveAdapters().due([record], Catalog([replaced], ENGINES)) == []
