"""ProfileKey (issue 33): one type for "which profile of which model", written ``model:profile``
only at the edges, read back by one validating parser, and the catalog's lookups by name."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmgw_control.catalog import ProfileKey
from llmgw_control.catalog.models import AdapterConfig, Catalog, EngineConfig, ModelConfig, ProfileConfig, WeightsConfig

W = WeightsConfig("http://files/m.gguf", "a" * 64, 100)
NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,95}", fullmatch=True)


def test_a_key_is_written_model_colon_profile_and_read_back() -> None:
    key = ProfileKey("qwen2.5-7b", "gpu")
    assert str(key) == "qwen2.5-7b:gpu"
    assert ProfileKey.parse("qwen2.5-7b:gpu") == key
    assert {key: 1}[ProfileKey("qwen2.5-7b", "gpu")] == 1
    assert ProfileKey.model_of("qwen2.5-7b:gpu") == "qwen2.5-7b"
    assert ProfileKey.model_of("static-model") == "static-model"


def test_parse_refuses_what_is_not_two_valid_names() -> None:
    for text in [
        "qwen",
        "qwen:",
        ":gpu",
        "qwen:gpu:x",
        "qwen:gpu\n",
        "qwen :gpu",
        "../x:gpu",
        "q" * 97 + ":gpu",
        "",
        ":",
        None,
        7,
        b"qwen:gpu",
    ]:
        assert ProfileKey.parse(text) is None, text


@given(NAMES, NAMES)
def test_every_valid_key_round_trips(model: str, profile: str) -> None:
    key = ProfileKey(model, profile)
    assert ProfileKey.parse(str(key)) == key


@given(st.text(max_size=300))
def test_parse_never_raises_and_only_answers_keys_it_would_write(text: str) -> None:
    key = ProfileKey.parse(text)
    assert key is None or str(key) == text


def _catalog(default_profile: str = "") -> Catalog:
    bot = AdapterConfig("bot", W)
    qwen = ModelConfig(
        "qwen",
        [ProfileConfig(name="gpu", weights=W, adapters=[bot]), ProfileConfig(name="cpu", weights=W)],
        default_profile="cpu",
    )
    llama = ModelConfig("llama", [ProfileConfig(name="gpu", weights=W)])
    return Catalog([qwen, llama], [EngineConfig(name="llama.cpp", version="b1")], default_profile)


def test_the_catalog_resolves_a_model_a_key_and_an_adapter() -> None:
    catalog = _catalog()
    qwen = catalog.resolve("qwen")
    assert qwen is not None and qwen.profile_key == str(ProfileKey("qwen", "cpu")) == "qwen:cpu"
    gpu = catalog.resolve("qwen:gpu")
    assert gpu is not None and gpu.profile.name == "gpu" and gpu.adapter is None
    bot = catalog.resolve("bot")
    assert bot is not None and bot.profile_key == "qwen:gpu" and bot.adapter is not None and bot.name == "bot"
    for name in ["nope", "qwen:nope", "nope:gpu", "bot:gpu", "qwen:gpu:x", "qwen:", ":gpu"]:
        assert catalog.resolve(name) is None, name
    assert _catalog("gpu").resolve("qwen") == gpu  # the global default wins where the model has it
    assert sorted(r.profile_key for r in catalog.all_profiles()) == ["llama:gpu", "qwen:cpu", "qwen:gpu"]


def test_the_catalog_follows_put_and_remove() -> None:
    catalog = _catalog()
    catalog.put(ModelConfig("mistral", [ProfileConfig(name="big", weights=W)]))
    assert (resolved := catalog.resolve("mistral")) is not None and resolved.profile_key == "mistral:big"
    catalog.put(ModelConfig("qwen", [ProfileConfig(name="gpu", weights=W)]))
    assert catalog.resolve("qwen:cpu") is None and catalog.resolve("bot") is None
    assert catalog.remove("mistral") is not None
    assert catalog.resolve("mistral") is None and catalog.resolve("mistral:big") is None
