"""``llmgw-control init``: every option written with its help and default; ``--check``."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from llmgw_control.cli import main
from llmgw_control.config import ControlConfig, load_config
from llmgw_control.init_config import DOCS, EXAMPLES, render_config
from llmgw_shared.config_doc import EXAMPLE_BEGIN, doc_of, missing_docs, uncomment_examples, walk


def run_cli(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    code = stopped.value.code
    assert isinstance(code, int)
    return code


def test_every_option_has_its_one_line_help() -> None:
    # A new field without a line in DOCS (or metadata["doc"]) fails here, naming it.
    assert missing_docs(ControlConfig, DOCS) == []
    # And the table names no option that no longer exists.
    known = {f"{cls.__name__}.{name}" for cls, name, _ in walk(ControlConfig)}
    assert set(DOCS) - known == set()


def test_init_output_loads_as_the_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "control.toml"
    assert run_cli(["init", "--output", str(path)]) == 0
    assert load_config(path) == load_config(None)
    assert run_cli(["init", "--check", str(path)]) == 0
    # Never overwritten by accident.
    assert run_cli(["init", "--output", str(path)]) == 1
    assert "--force" in capsys.readouterr().err


def test_every_option_appears_with_its_help_and_default() -> None:
    text = render_config()
    lines = text.splitlines()
    for cls, name, path in walk(ControlConfig):
        doc = doc_of(cls, name, DOCS)  # a field may carry its line as metadata["doc"]
        # The help line sits right above the key (or the section it introduces).
        at = [i for i, line in enumerate(lines) if line.lstrip("# ").startswith(doc)]
        assert at, f"no help line for {path}"
        following = lines[at[0] + 1].lstrip("# ")
        assert following.startswith((f"{name} =", f"[{path}]", f"[[{path}]]", EXAMPLE_BEGIN.lstrip("# "))), path
    assert 'Default: "127.0.0.1:8080".' in text
    assert "Default: 300.0." in text


def test_the_examples_uncommented_are_valid_config(tmp_path: Path) -> None:
    text = uncomment_examples(render_config())
    # Models need an agent listener to run on; with one, the examples validate as a whole.
    text = text.replace("[agents]\n", '[agents]\nlisten = "127.0.0.1:0"\n', 1).replace('\nlisten = ""\n', "\n", 1)
    path = tmp_path / "examples.toml"
    path.write_text(text)
    config = load_config(path)
    assert config.models == EXAMPLES["models"]
    assert config.endpoints == EXAMPLES["endpoints"]


def test_a_config_with_every_section_filled_round_trips(tmp_path: Path) -> None:
    config = attrs.evolve(
        ControlConfig(),
        models=EXAMPLES["models"],
        endpoints=EXAMPLES["endpoints"],
        agents=attrs.evolve(ControlConfig().agents, listen="0.0.0.0:8443"),
    )
    path = tmp_path / "filled.toml"
    path.write_text(render_config(config))
    assert EXAMPLE_BEGIN not in path.read_text()
    assert load_config(path) == config


def test_check_reports_the_daemons_own_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('listen = "127.0.0.1:8080"\n[router]\nmax_atempts = 2\n')
    assert run_cli(["init", "--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmgw-control: config error:")
    assert "max_atempts" in err
    path.write_text('listen = "8080"\n')
    assert run_cli(["init", "--check", str(path)]) == 2
    assert "listen '8080': expected host:port" in capsys.readouterr().err


@pytest.mark.slow  # left out of the quick tier: the daemon as a process
def test_an_address_in_use_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "llmgw-control"),
                "run",
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                "127.0.0.1:0",
                "--data-dir",
                str(tmp_path / "data"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert "llmgw-control: cannot start: " in result.stderr
    assert "Traceback" not in result.stderr


def test_the_shipped_example_is_what_init_writes() -> None:
    # A changed default or help line reaches examples/control.toml only by running init again.
    example = Path(__file__).resolve().parents[2] / "examples" / "control.toml"
    assert example.read_text() == render_config(), "regenerate: llmgw-control init --force -o examples/control.toml"
