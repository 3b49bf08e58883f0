"""The names that arrive from the network: one pattern each, matched whole, refused by name."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_shared.names import (
    BadName,
    check_asset_name,
    check_digest,
    check_engine_name,
    check_node_id,
    check_replica_id,
    check_sha256,
    check_version,
    check_weight_file_name,
)

CHECKS: dict[str, Callable[[object], str]] = {
    "node id": check_node_id,
    "engine name": check_engine_name,
    "version": check_version,
    "replica id": check_replica_id,
    "asset name": check_asset_name,
    "weight file name": check_weight_file_name,
}
# One path component's worst enemies, and what a lax pattern (re.match with '$') lets through.
HOSTILE = [
    "",
    ".",
    "..",
    "../x",
    "a/b",
    "a\\b",
    "/abs",
    "a\x00b",
    "a\n",
    "\na",
    "-rf",
    ".hidden",
    " a",
    "a b",
    "a\u2028b",
    "é",
    5,
    None,
    b"b4001",
]


@pytest.mark.parametrize("kind", list(CHECKS))
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_names_are_refused_naming_the_kind(kind: str, value: object) -> None:
    with pytest.raises(BadName) as info:
        CHECKS[kind](value)
    assert str(info.value).startswith(f"{kind} {value!r}"[:40].rstrip(".")) and "is not valid: use " in str(info.value)


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("engine name", "llama.cpp"),
        ("engine name", "vllm"),
        ("version", "b11312"),
        ("version", "0.11.0+cu124"),
        ("replica id", "tiny-0"),
        ("asset name", "llama-b11312-bin-ubuntu-cuda-12.4-x64.tar.gz"),
        ("asset name", "cudart-llama-bin-win-cuda-12.4-x64.zip"),
        ("weight file name", "Qwen2.5-7B-Instruct-Q4_K_M.gguf"),
    ],
)
def test_real_names_pass(kind: str, value: str) -> None:
    assert CHECKS[kind](value) == value


def test_traversal_through_an_asset_name_is_refused() -> None:
    with pytest.raises(BadName, match=r"^asset name 'llama-b4001/\.\./"):
        check_asset_name("llama-b4001/../../../../x-bin-ubuntu-x64.tar.gz")
    with pytest.raises(BadName):
        check_asset_name("llama-b4001..tar.gz")  # no '..' anywhere, not even inside a component
    with pytest.raises(BadName):
        check_asset_name("a" * 201)


def test_digests_are_sha256_and_64_hex_digits() -> None:
    assert check_digest("sha256:" + "AB" * 32) == "ab" * 32
    assert check_sha256("CD" * 32) == "cd" * 32
    for bad in [
        "sha256:../../../x",
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 64 + "\n",
        "sha512:" + "a" * 64,
        "a" * 64,
        "sha256:" + "g" * 64,
        None,
    ]:
        with pytest.raises(BadName, match=r"^digest .* is not valid: use 'sha256:' and 64 hex digits$"):
            check_digest(bad)
    with pytest.raises(BadName, match=r"^sha256 '\.\./x' is not valid"):
        check_sha256("../x")


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(list(CHECKS)), st.text(max_size=300))
def test_whatever_passes_is_one_plain_path_component(kind: str, value: str) -> None:
    try:
        out = CHECKS[kind](value)
    except BadName:
        return
    assert out == value
    assert value not in ("", ".", "..") and not value.startswith((".", "-"))
    assert "/" not in value and "\\" not in value and "\x00" not in value
    assert value.isascii() and value.isprintable() and " " not in value
    assert len(value.encode()) <= 255
