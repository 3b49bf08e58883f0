"""``llmgw-node init``: every option written with its help and default; ``--check``; the token."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw_node.cli import main
from llmgw_node.config import NodeConfig, load_config
from llmgw_node.init_config import DOCS, EXAMPLES, TOKEN_ENV, render_config
from llmgw_shared.config_doc import doc_of, missing_docs, uncomment_examples, walk

URL = "ws://10.0.0.1:8443/agent/v1"


def run_cli(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    code = stopped.value.code
    assert isinstance(code, int)
    return code


def test_every_option_has_its_one_line_help() -> None:
    assert missing_docs(NodeConfig, DOCS) == []
    known = {f"{cls.__name__}.{name}" for cls, name, _ in walk(NodeConfig)}
    assert set(DOCS) - known == set()


def test_every_option_appears_right_under_its_help() -> None:
    lines = render_config().splitlines()
    for cls, name, path in walk(NodeConfig):
        doc = doc_of(cls, name, DOCS)
        assert doc is not None, path
        at = [i for i, line in enumerate(lines) if line.lstrip("# ").startswith(doc)]
        assert at, f"no help line for {path}"
        # A section ([tracing]) is a table of its own, its options' help lines under it.
        assert lines[at[0] + 1].lstrip("# ").startswith((f"{name} =", ">>> example", f"[{path}]")), path


def test_init_writes_a_config_that_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "llmgw-join-abc123")
    path = tmp_path / "etc" / "node.toml"
    assert (
        run_cli(["init", "-o", str(path), "--control", URL, "--node-id", "gpu-3", "--data-dir", str(tmp_path / "data")])
        == 0
    )
    config = load_config(path)
    assert config.control == [URL]
    assert config.node_id == "gpu-3"
    assert config.token == "llmgw-join-abc123"
    assert config.data_dir == str(tmp_path / "data")
    # Everything else is the default.
    assert config.reconnect_max_s == NodeConfig().reconnect_max_s
    # It holds a secret: readable by its owner only.
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert run_cli(["init", "--check", str(path)]) == 0


def test_without_a_token_the_file_is_not_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    path = tmp_path / "node.toml"
    assert run_cli(["init", "-o", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert load_config(path).token == ""
    token_file = tmp_path / "token"
    token_file.write_text("llmgw-join-fromfile\n")
    assert run_cli(["init", "-o", str(path), "--force", "--token-file", str(token_file)]) == 0
    assert load_config(path).token == "llmgw-join-fromfile"


def test_the_example_engine_uncommented_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(uncomment_examples(render_config()))
    assert load_config(path).engines == EXAMPLES["engines"]


def test_check_and_init_refuse_what_run_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('control = "ws://x/agent/v1"\n')
    assert run_cli(["init", "--check", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"llmgw-node: {path}: control")
    path.write_text(f'control = ["wss://x/agent/v1"]\ntls_ca_file = "{tmp_path / "missing.pem"}"\n')
    assert run_cli(["init", "--check", str(path)]) == 2
    assert "tls_ca_file" in capsys.readouterr().err
    assert run_cli(["init", "--control", "http://x:1/agent/v1"]) == 2
    assert "not a ws:// or wss:// URL" in capsys.readouterr().err


def test_a_data_dir_it_cannot_create_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = tmp_path / "node.toml"
    path.write_text(f'node_id = "n1"\ndata_dir = "{blocker / "data"}"\n')
    result = subprocess.run(
        [str(Path(sys.executable).parent / "llmgw-node"), "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "llmgw-node: stopped: " in result.stderr
    assert "Traceback" not in result.stderr
