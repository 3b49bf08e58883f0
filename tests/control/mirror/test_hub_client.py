"""The Hub client (huggingface-hub) against the fake Hub: search, tree with LFS digests, and the
library's requests being exactly the ones the fake serves."""

from __future__ import annotations

import hashlib

import pytest

from llmgw_control.api_errors import AdminApiError
from llmgw_control.mirror.config import HubConfig
from llmgw_control.mirror.hub import Hub
from llmgw_control.mirror.names import quantisation
from llmgw_dev.fake_hub import FakeHub, run_fake_hub

# The fake Hub listens on loopback, which the URL guard lets through only when allowed.
LOOPBACK = ["127.0.0.0/8"]


async def test_search_lists_gguf_repos_most_downloaded_first(fake_hub_repos: FakeHub) -> None:
    async with run_fake_hub(fake_hub_repos) as fake:
        hub = Hub(HubConfig(endpoint=fake.url, allow_networks=LOOPBACK))
        found = await hub.search("acme")
        assert [r.id for r in found] == ["acme/tiny-chat-GGUF", "acme/other-GGUF"]
        assert found[0].downloads == 50
        assert [r.id for r in await hub.search("tiny")] == ["acme/tiny-chat-GGUF"]


async def test_tree_lists_gguf_files_with_lfs_sha256_and_quantisation(
    fake_hub_repos: FakeHub, tiny_gguf: bytes
) -> None:
    async with run_fake_hub(fake_hub_repos) as fake:
        hub = Hub(HubConfig(endpoint=fake.url, allow_networks=LOOPBACK))
        files = {f.path: f for f in await hub.gguf_files("acme/tiny-chat-GGUF")}
        assert set(files) == {"tiny-chat.Q8_0.gguf", "sub/tiny-chat-IQ2_XXS.gguf", "big-00001-of-00002.gguf"}
        top = files["tiny-chat.Q8_0.gguf"]
        assert (top.size, top.sha256, top.quantisation) == (
            len(tiny_gguf),
            hashlib.sha256(tiny_gguf).hexdigest(),
            "Q8_0",
        )
        assert files["sub/tiny-chat-IQ2_XXS.gguf"].quantisation == "IQ2_XXS"
        assert files["big-00001-of-00002.gguf"].split
        with pytest.raises(AdminApiError) as caught:
            await hub.gguf_files("acme/missing")
        assert caught.value.status == 404


async def test_the_librarys_requests_are_exactly_what_the_fake_serves(fake_hub_repos: FakeHub) -> None:
    async with run_fake_hub(fake_hub_repos) as fake:
        hub = Hub(HubConfig(endpoint=fake.url, allow_networks=LOOPBACK))
        await hub.search("tiny", limit=5)
        await hub.gguf_files("acme/tiny-chat-GGUF", "main")
    assert fake.unserved == []
    assert [(s.method, s.path) for s in fake.seen] == [
        ("GET", "/api/models"),
        ("GET", "/api/models/acme/tiny-chat-GGUF/tree/main"),
    ]
    search = fake.seen[0].query
    assert search["search"] == ["tiny"] and search["filter"] == ["gguf"] and search["limit"] == ["5"]
    assert fake.seen[1].query["recursive"] == ["true"]
    # No token from the machine is sent when [hub] names none.
    assert all("authorization" not in s.headers for s in fake.seen)


async def test_a_configured_token_is_sent(fake_hub_repos: FakeHub, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    token = tmp_path / "token"
    token.write_text("hf_secret\n")
    async with run_fake_hub(fake_hub_repos) as fake:
        await Hub(HubConfig(endpoint=fake.url, token_file=str(token), allow_networks=LOOPBACK)).search("x")
    assert fake.seen[0].headers["authorization"] == "Bearer hf_secret"


async def test_an_unreachable_hub_is_a_502_not_a_crash() -> None:
    # At once: the library's retries (about 23 s of them) are not taken (mirror/hub_http.py).
    hub = Hub(HubConfig(endpoint="http://127.0.0.1:9", allow_networks=LOOPBACK))
    with pytest.raises(AdminApiError) as caught:
        await hub.search("x")
    assert caught.value.status == 502


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("model.Q8_0.gguf", "Q8_0"),
        ("x-IQ2_XXS.gguf", "IQ2_XXS"),
        ("phi-3-mini-4k-instruct-fp16.gguf", "FP16"),
        ("qwen-bf16.gguf", "BF16"),
        ("a/b/m-q5_k_s.gguf", "Q5_K_S"),
        ("model.gguf", ""),
        ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
        ("m-Q4_0_4_4.gguf", "Q4_0_4_4"),
        ("ternary-TQ1_0.gguf", "TQ1_0"),
        ("Qwen2-7B.gguf", ""),
    ],
)
def test_quantisation_from_the_file_name(name: str, quant: str) -> None:
    assert quantisation(name) == quant
