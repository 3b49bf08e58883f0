"""The node config file: the shipped example parses, mistakes are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_node.config import ConfigError, load_config, parse_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "node.toml"


def test_the_example_config_is_valid_and_shows_the_defaults() -> None:
    config = load_config(EXAMPLE)
    assert config.control == ["ws://127.0.0.1:8090/agent/v1"]
    assert parse_config({"control": config.control}) == config  # the example states the defaults


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"alow_os_packages": True}, "(top level): unknown key 'alow_os_packages'"),
        ({"control": "ws://x/agent/v1"}, "control: expected a list, got a string"),
        ({"control": ["http://x/agent/v1"]}, "control: 'http://x/agent/v1' is not a ws:// or wss:// URL"),
        ({"reconnect_min_s": "1"}, "reconnect_min_s: expected a number, got a string"),
        ({"allow_os_packages": 1}, "allow_os_packages: expected true or false"),
        ({"engines": [{"name": "vllm"}]}, "engines[0].path: required key missing"),
        ({"engines": [{"name": "v", "path": "/a"}, {"name": "v", "path": "/b"}]}, "an engine name appears twice"),
        ({"engines": [{"name": "../v", "path": "/a"}]}, "engines[0].name: engine name '../v' is not valid: use "),
        ({"unpack_max_bytes": 0}, "unpack_max_bytes: must be more than 0"),
        ({"unpack_max_entries": -1}, "unpack_max_entries: must be more than 0"),
        (
            {"install_retry_min_s": 60.0, "install_retry_max_s": 30.0},
            "install_retry_min_s is more than install_retry_max_s",
        ),
    ],
)
def test_mistakes_are_refused_by_name(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="node.toml")
    assert str(info.value).startswith("node.toml: ") and message in str(info.value)


def test_token_is_not_in_repr() -> None:
    assert "llmgw-join-abc" not in repr(parse_config({"token": "llmgw-join-abc"}))
