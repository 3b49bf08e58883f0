"""``llmgw-control join-token``: the command the config's messages name, run as an operator would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmgw_control.config import ControlConfig, validate
from llmgw_control.fleet.agents import AgentsConfig, token_digest
from llmgw_control.fleet.onboarding import TOKEN_PREFIX

BIN = Path(sys.executable).parent


@pytest.mark.slow  # left out of the quick tier: the CLI and the daemon as processes
def test_it_makes_a_token_and_the_digest_the_config_takes() -> None:
    out = subprocess.run([str(BIN / "llmgw-control"), "join-token"], capture_output=True, text=True, check=True).stdout
    lines = [line.strip() for line in out.splitlines()]
    token = next(line for line in lines if line.startswith(TOKEN_PREFIX))
    digest = next(line for line in lines if line.startswith("sha256:"))
    assert digest == token_digest(token)
    validate(ControlConfig(agents=AgentsConfig(join_token_digests=[digest])))
    # The digest of an existing token, read from standard input (never argv).
    again = subprocess.run(
        [str(BIN / "llmgw-control"), "join-token", "--digest"],
        input=token + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert again == digest
    empty = subprocess.run(
        [str(BIN / "llmgw-control"), "join-token", "--digest"], input="", capture_output=True, text=True, check=False
    )
    assert empty.returncode == 2 and "no token" in empty.stderr
