"""``llmgw-control release`` and ``engines`` end an error the same way (``cli_exits.py``): one line
on stderr naming the command, 2 for a wrong config, 1 for anything else they stop on."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_control import engines_cli, release_cli
from llmgw_control.cli_exits import BAD_CONFIG, FAILED


def test_a_wrong_config_exits_2_naming_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "control.toml"
    config.write_text("listen = [\n")  # not TOML
    assert release_cli.main(["--config", str(config), "list"]) == BAD_CONFIG
    assert capsys.readouterr().err.startswith("llmgw-control release: ")
    assert engines_cli.main(["--config", str(config), "runtime", "--cuda", "12"]) == BAD_CONFIG
    assert capsys.readouterr().err.startswith("llmgw-control engines: ")


def test_a_refused_release_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert release_cli.main(["--files-dir", str(tmp_path), "use", "no-such-release"]) == FAILED
    err = capsys.readouterr().err
    assert err.startswith("llmgw-control release: ") and err.count("\n") == 1


def test_a_file_it_cannot_use_exits_1_with_its_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The files directory is a file: the first thing made under it fails with the OS's words and the path.
    blocker = tmp_path / "files"
    blocker.write_text("")
    code = engines_cli.main(
        ["--files-dir", str(blocker), "runtime", "--cuda", "12", "--arch", "x86_64", "--wheels-from", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == FAILED and err.startswith("llmgw-control engines: ") and str(blocker) in err
