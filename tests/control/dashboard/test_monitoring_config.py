"""``[monitoring] prometheus``: a plain http(s) base URL or nothing; anything else is refused at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_control.config import load_config
from llmgw_shared.config import ConfigError


def load(tmp_path: Path, text: str) -> str:
    path = tmp_path / "control.toml"
    path.write_text(text)
    return load_config(path).monitoring.prometheus


def test_default_is_off(tmp_path: Path) -> None:
    assert load(tmp_path, "") == ""


def test_a_url_is_normalised(tmp_path: Path) -> None:
    assert load(tmp_path, '[monitoring]\nprometheus = "http://10.0.0.9:9090/"\n') == "http://10.0.0.9:9090"
    assert load(tmp_path, '[monitoring]\nprometheus = "https://mon.example/prom"\n') == "https://mon.example/prom"


@pytest.mark.parametrize(
    "text",
    [
        '[monitoring]\nprometheus = "10.0.0.9:9090"\n',
        '[monitoring]\nprometheus = "ftp://10.0.0.9"\n',
        '[monitoring]\nprometheus = "http://10.0.0.9:9090/?x=1"\n',
        "[monitoring]\nprometheus = 9090\n",
        '[monitoring]\nprometheus_url = "http://10.0.0.9:9090"\n',
    ],
)
def test_anything_else_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError):
        load(tmp_path, text)
