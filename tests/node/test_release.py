"""Choosing the release asset for a node: OS, architecture, CUDA or CPU."""

from __future__ import annotations

import pytest

from llmgw_node.engines.release import Platform, ReleaseError, choose_assets, parse_release

UPSTREAM = {
    "tag_name": "b6000",
    "assets": [
        {"name": n, "size": 10, "browser_download_url": f"https://example.invalid/{n}", "digest": f"sha256:{'a' * 64}"}
        for n in [
            "cudart-llama-bin-win-cuda-12.4-x64.zip",
            "llama-b6000-bin-macos-arm64.zip",
            "llama-b6000-bin-ubuntu-x64.zip",
            "llama-b6000-bin-ubuntu-vulkan-x64.zip",
            "llama-b6000-bin-ubuntu-cuda-12.4-x64.tar.gz",
            "cudart-llama-bin-ubuntu-cuda-12.4-x64.tar.gz",
            "llama-b6000-bin-linux-arm64.tar.gz",
            "llama-b6000-bin-win-cpu-x64.zip",
            "llama-b6000-xcframework.zip",
        ]
    ],
}


def names(plat: Platform) -> list[str]:
    return [a.name for a in choose_assets(parse_release(UPSTREAM), plat)]


def test_cpu_node_gets_the_cpu_build() -> None:
    assert names(Platform("linux", "x86_64", cuda=False)) == ["llama-b6000-bin-ubuntu-x64.zip"]


def test_cuda_node_gets_the_cuda_build_and_its_runtime() -> None:
    assert names(Platform("linux", "x86_64", cuda=True)) == [
        "llama-b6000-bin-ubuntu-cuda-12.4-x64.tar.gz",
        "cudart-llama-bin-ubuntu-cuda-12.4-x64.tar.gz",
    ]


def test_arm_node_gets_the_arm_build() -> None:
    assert names(Platform("linux", "aarch64", cuda=False)) == ["llama-b6000-bin-linux-arm64.tar.gz"]


def test_digest_is_parsed() -> None:
    assets = parse_release(UPSTREAM)
    assert all(a.sha256 == "a" * 64 for a in assets)


def test_nothing_fits_lists_every_asset_and_why() -> None:
    with pytest.raises(ReleaseError) as info:
        choose_assets(parse_release(UPSTREAM), Platform("linux", "riscv64", cuda=False))
    text = str(info.value)
    assert text.startswith("no asset fits linux/riscv64: ")
    assert "llama-b6000-bin-ubuntu-x64.zip (built for x64)" in text
    assert "llama-b6000-bin-macos-arm64.zip (built for macos)" in text
    assert "cudart-llama-bin-win-cuda-12.4-x64.zip (a CUDA runtime, not a build)" in text
    assert "llama-b6000-xcframework.zip (not a llama.cpp build archive)" in text


def test_not_a_release_document() -> None:
    with pytest.raises(ReleaseError, match="no 'assets' list"):
        parse_release({"message": "API rate limit exceeded"})


def _one(**fields: object) -> dict[str, object]:
    asset: dict[str, object] = {
        "name": "llama-b6000-bin-ubuntu-x64.tar.gz",
        "size": 10,
        "browser_download_url": "https://example.invalid/a.tar.gz",
        "digest": f"sha256:{'a' * 64}",
    }
    asset.update(fields)
    return {"assets": [asset]}


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (
            {"name": "llama-b4001/../../../../x-bin-ubuntu-x64.tar.gz"},
            "asset name 'llama-b4001/../../../../x-bin-ubuntu-x64.tar.gz' is not valid: use a plain file name",
        ),
        (
            {"name": "llama-b4001-bin-ubuntu-x64.tar.gz\n"},
            "asset name 'llama-b4001-bin-ubuntu-x64.tar.gz\\n' is not valid",
        ),
        ({"name": "llama-" + "x" * 300 + "-bin-ubuntu-x64.tar.gz"}, "is not valid: use a plain file name: 1-200"),
        ({"digest": "sha256:../../../x"}, "digest 'sha256:../../../x' is not valid: use 'sha256:' and 64 hex digits"),
        ({"digest": "sha256:" + "a" * 64 + "/../x"}, "is not valid: use 'sha256:' and 64 hex digits"),
        ({"size": 0}, "size 0 is not a positive number of bytes"),
        ({"size": True}, "size True is not a positive number of bytes"),
        ({"size": "10"}, "size '10' is not a positive number of bytes"),
    ],
)
def test_an_asset_whose_name_digest_or_size_is_bad_is_never_chosen(fields: dict[str, object], why: str) -> None:
    assets = parse_release(_one(**fields))
    assert why in assets[0].refused
    with pytest.raises(ReleaseError) as info:
        choose_assets(assets, Platform("linux", "x86_64", cuda=False))
    assert why in str(info.value)


def test_a_release_without_a_digest_is_parsed_and_refused_at_download() -> None:
    # GitHub added digests in 2025; older releases have none. The manager refuses to install
    # those (an unverified archive), with its own message.
    data = _one()
    del data["assets"][0]["digest"]  # type: ignore[index, attr-defined]
    [asset] = parse_release(data)
    assert asset.sha256 == "" and not asset.refused


def test_a_release_with_too_many_assets_is_not_one() -> None:
    with pytest.raises(ReleaseError, match="lists 1001 assets"):
        parse_release({"assets": [_one()["assets"][0]] * 1001})  # type: ignore[index]


def test_relative_download_urls_resolve_against_the_index_and_only_http_urls_are_used() -> None:
    digest = "sha256:" + "a" * 64
    name = "llama-b1-bin-ubuntu-x64.tar.gz"

    def asset(url: str) -> dict[str, object]:
        return {"name": name, "size": 10, "digest": digest, "browser_download_url": url}

    index = "http://10.0.0.1:8443/releases/llama.cpp/b1"
    (relative,) = parse_release({"assets": [asset(f"../../files/engines/{name}")]}, base_url=index)
    assert relative.url == f"http://10.0.0.1:8443/files/engines/{name}" and not relative.refused
    # A download URL is fetched and recorded in every hello: http(s) and of sane length only.
    for bad in (f"file:///etc/{name}", "ftp://x/y", "http://x/" + "a" * 2100, f"files/engines/{name}"):
        (refused,) = parse_release({"assets": [asset(bad)]})
        assert "is not an http(s) URL of at most 2048 characters" in refused.refused, bad
