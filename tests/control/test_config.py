"""The control config: strict types, unknown keys and bad values refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_control.catalog import EngineConfig
from llmgw_control.config import ControlConfig, load_config, parse_endpoint_flag, validate
from llmgw_shared.config import ConfigError, parse_host_port


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "control.toml"
    path.write_text(text)
    return path


def test_defaults_are_safe() -> None:
    config = load_config(None)
    assert config.admin_listen.startswith("127.0.0.1:")
    assert config.listen.startswith("127.0.0.1:")
    assert config.router.max_body_bytes == 32 * 1024 * 1024
    assert config == load_config(None, {})


def test_a_full_file_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
listen = "0.0.0.0:9000"
shutdown_grace = 12.5
[router]
connect_timeout = 2
idle_timeout = 30.0
[[endpoints]]
id = "gpu-1"
url = "http://10.0.0.5:8001/"
models = ["llama", "qwen"]
weight = 2
api_key = "k"
""",
    )
    config = load_config(path)
    assert config.listen == "0.0.0.0:9000"
    assert config.router.connect_timeout == 2.0
    assert config.endpoints[0].url == "http://10.0.0.5:8001"  # trailing slash normalised
    assert config.endpoints[0].weight == 2.0
    assert "k" not in repr(config.endpoints[0])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lissen = '1.2.3.4:5'", "unknown key 'lissen'"),
        ("[router]\nretries = 3", "router: unknown key 'retries'"),
        ("shutdown_grace = 'long'", "shutdown_grace: expected a number, got a string"),
        ("[router]\nmax_attempts = 2.5", "router.max_attempts: expected an integer, got a number"),
        ("[router]\nmax_attempts = true", "router.max_attempts: expected an integer, got a boolean"),
        ("[router]\nmax_attempts = 0", "router.max_attempts must be at least 1"),
        ("[router]\nidle_timeout = 0", "router.idle_timeout must be greater than 0"),
        ("log_level = 'loud'", "log_level must be one of"),
        ("[[endpoints]]\nurl = 'http://h:1'\nmodels = ['m']", "endpoints[0].id: required key missing"),
        ("[[endpoints]]\nid = 'a'\nurl = 'http://h:1'\nmodels = []", "models must name at least one model"),
        ("[[endpoints]]\nid = 'a'\nurl = 'http://h:1'\nmodels = [3]", "endpoints[0].models[0]: expected a string"),
        ("[[endpoints]]\nid = 'a b'\nurl = 'http://h:1'\nmodels = ['m']", "endpoints[0].id 'a b'"),
        ("[[endpoints]]\nid = 'a'\nurl = 'http://h:x'\nmodels = ['m']", "invalid port"),
        ("[[endpoints]]\nid = 'a'\nurl = 'h:1'\nmodels = ['m']", "not an http(s) URL"),
        ("listen = ", "not valid TOML"),
        ("admin_hosts = ['http://control.example']", "admin_hosts: 'http://control.example' is not a host name"),
        ("admin_hosts = ['control.example:8081']", "is not a host name (no scheme, port or path)"),
        ("admin_hosts = 'control.example'", "admin_hosts: expected a list, got a string"),
    ],
)
def test_bad_files_are_refused_by_name(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text))
    assert message in str(error.value)


def test_flags_override_the_file_and_add_endpoints(tmp_path: Path) -> None:
    path = write(tmp_path, "[[endpoints]]\nid = 'a'\nurl = 'http://h:1'\nmodels = ['m']\n")
    extra = parse_endpoint_flag("b=http://h:2/prefix=m,n")
    config = load_config(path, {"listen": "127.0.0.1:1", "admin_listen": None, "extra_endpoints": [extra]})
    assert config.listen == "127.0.0.1:1"
    assert config.admin_listen == ControlConfig().admin_listen
    assert [e.id for e in config.endpoints] == ["a", "b"]
    assert config.endpoints[1].url == "http://h:2/prefix" and config.endpoints[1].models == ["m", "n"]


@pytest.mark.parametrize("text", ["nothing", "=http://h:1=m", "a=http://h:1=", "a=="])
def test_malformed_endpoint_flags(text: str) -> None:
    with pytest.raises(ConfigError, match="expected id=URL=model"):
        parse_endpoint_flag(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:80", ("127.0.0.1", 80)),
        ("[::1]:0", ("::1", 0)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
        ("localhost:8080", ("localhost", 8080)),
    ],
)
def test_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize("text", [":80", "80", "::1:80", "h:", "h:-1", "h:70000", "[::1]80"])
def test_bad_host_port(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_host_port(text)


def test_a_string_where_a_list_belongs_is_refused(tmp_path: Path) -> None:
    # cattrs alone would split "llama" into ['l', 'l', 'a', 'm', 'a'].
    with pytest.raises(ConfigError, match=r"endpoints\[0\]\.models: expected a list, got a string"):
        load_config(write(tmp_path, "[[endpoints]]\nid = 'a'\nurl = 'http://h:1'\nmodels = 'llama'\n"))


@pytest.mark.parametrize(
    "name, version", [("llama.cpp", "."), ("llama.cpp", ""), ("../x", "b1"), ("llama.cpp", "b1\n")]
)
def test_an_engine_name_or_version_a_node_would_refuse_is_refused_at_start(name: str, version: str) -> None:
    with pytest.raises(ConfigError, match="engines: "):
        validate(ControlConfig(engines=[EngineConfig(name=name, version=version)]))


def test_stream_continuation_settings_are_checked(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[router]\nmax_continuations = 1\ncontinue_streams = { tiny = false }\n"))
    assert config.router.max_continuations == 1 and config.router.continue_streams == {"tiny": False}
    assert load_config(None).router.max_continuations == 2  # on by default
    for text, named in (
        ("max_continuations = -1", "router.max_continuations"),
        ("max_continuations = true", "max_continuations"),
        ('continue_streams = { tiny = "no" }', "continue_streams"),
        ('continue_streams = { " " = false }', "router.continue_streams"),
    ):
        with pytest.raises(ConfigError, match=named):
            load_config(write(tmp_path, f"[router]\n{text}\n"))
