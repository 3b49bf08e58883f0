"""Every command a doc or a message names exists: checked against the real command-line parsers.

``config.py`` once told operators to run ``llmgw-control token``, which did not exist. This reads
every doc (README, docs/, examples/), every source file of the three packages and the dev tools
(messages, comments, the install script, the systemd units), finds each ``llmgw-control``,
``llmgw-control ctl`` and ``llmgw-node`` command line in them, and walks it through the parsers
the programs really use: each subcommand word must be one of its parser's choices, and each
``--option`` one of the options of the (sub)command it follows.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from llmgw_control.cli import build_parser as control_parser
from llmgw_control.ctl.main import build_parser as ctl_parser
from llmgw_control.engines_cli import build_parser as engines_parser
from llmgw_control.release_cli import build_parser as release_parser
from llmgw_node.cli import _parser as node_parser

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "examples").rglob("*")),
    *sorted((ROOT / "shared" / "src").rglob("*.py")),
    *sorted((ROOT / "llmgw_control" / "src").rglob("*")),
    *sorted((ROOT / "llmgw_node" / "src").rglob("*.py")),
    *sorted((ROOT / "tools").rglob("*.py")),
    ROOT / "dev.py",
]
_TEXT_SUFFIXES = {".md", ".py", ".toml", ".sh", ".service", ".txt", ".html", ".js", ""}
# A program name, alone or as a binary's path (/opt/llmgw-node/bin/llmgw-node run ...), but not a
# directory (/var/lib/llmgw-node), a file (llmgw-node.service) or a package (--package llmgw-node).
_PROGRAM = re.compile(r"(?<![\w./-])(?:(?:[\w.-]*/)*bin/)?(llmgw-control|llmgw-node)(?![\w./-])")
_PACKAGE_FLAG = re.compile(r"--package\s+$")
# Words that follow a program's name in prose ("llmgw-control ready", "installs llmgw-node from
# ..."), never a subcommand: a mention followed by one of these is not a command line. Anything
# else is checked, so a wrong or removed subcommand ("llmgw-control token") fails.
PROSE = frozenset(
    {
        "and",
        "configuration",
        "connects",
        "crashed",
        "does",
        "from",
        "here",
        "needs",
        "on",
        "ready",
        "running",
        "runs",
        "stopped",
        "wheels",
        "is",
        "has",
        "can",
        "will",
        "must",
        "should",
        "sends",
        "to",
        "as",
        "or",
        "the",
        "itself",
        "daemon",
        "process",
    }
)
_WORD = re.compile(r"[a-z][a-z0-9-]*")
# llmgw-control's commands that hand the rest of the line to a parser of their own.
_DELEGATED = {"ctl": ctl_parser, "release": release_parser, "engines": engines_parser}
_TRAILING = ")].,;:'\"`*|"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return dict(parser._option_string_actions)


def check_command(program: str, words: list[str]) -> str | None:
    """None when the command line parses as far as it names things; else what is wrong."""
    parser = control_parser() if program == "llmgw-control" else node_parser()
    path = program
    skip_value = False
    leaf = False
    for raw in words:
        word = raw.rstrip(_TRAILING)
        if skip_value:
            skip_value = False
            continue
        if word.startswith("--"):
            option = word.split("=", 1)[0]
            action = _options(parser).get(option)
            if action is None:
                return f"{path}: no option {option}"
            if isinstance(action, argparse._VersionAction | argparse._HelpAction):
                break  # the program prints and exits: what follows is not part of the command
            skip_value = action.nargs != 0 and "=" not in word
            continue
        if leaf or not _WORD.fullmatch(word):
            leaf = True  # a positional argument, a placeholder or prose: only options are checked now
            if word != raw:
                break  # punctuation ended the command
            continue
        choices = _subcommands(parser)
        if program == "llmgw-control" and path == "llmgw-control" and word in _DELEGATED:
            parser, path = _DELEGATED[word](), f"llmgw-control {word}"
            continue
        if not choices:
            leaf = True
            continue
        if word not in choices:
            return f"{path}: no command {word!r} (there are: {', '.join(sorted(choices))})"
        parser, path = choices[word], f"{path} {word}"
        if word != raw:
            break
    return None


def commands_in(text: str) -> list[tuple[int, str, list[str]]]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in _PROGRAM.finditer(line):
            if _PACKAGE_FLAG.search(line[: match.start()]):
                continue
            rest = line[match.end() :]
            # The command ends where the line, a code span or a shell separator does.
            rest = re.split(r"`|&&|\|\||;|\$\(|\)\s|\s#\s", rest, maxsplit=1)[0]
            words = rest.split()
            if words and (words[0].rstrip(_TRAILING + "?") in PROSE or words[0].endswith((":", "?"))):
                continue  # prose about the program, or a label ("llmgw-node install: ...")
            found.append((number, match.group(1), words))
    return found


def problems() -> list[str]:
    out = []
    for path in SOURCES:
        if not path.is_file() or path.suffix not in _TEXT_SUFFIXES or "__pycache__" in path.parts:
            continue
        for number, program, words in commands_in(path.read_text(errors="replace")):
            problem = check_command(program, words)
            if problem is not None:
                out.append(f"{path.relative_to(ROOT)}:{number}: {problem}")
    return out


def test_every_command_named_in_docs_and_messages_exists() -> None:
    assert problems() == []


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        ("llmgw-control ctl nodes add NAME", True),
        ("llmgw-control ctl keys create ops --group org --admin-key --expires 2027-01-01T00:00:00Z", True),
        ("(add one with: llmgw-control ctl models add --file model.toml)", True),
        ("ExecStart=/opt/llmgw-node/bin/llmgw-node run --config /etc/llmgw/node.toml", True),
        ("llmgw-control run --listen 0.0.0.0:8080 --endpoint gpu1=http://10.0.0.11:8001=m", True),
        ("`llmgw-node init --check CONFIG` validates", True),
        ("(llmgw-control token prints one)", False),
        ("llmgw-control ctl nodes remove gpu-1", False),
        ("llmgw-control ctl keys create ops --admin", True),  # --admin is ctl's common URL option
        ("llmgw-control ctl keys create ops --no-such-flag", False),
        ("llmgw-node engines install --nope", False),
        ("(is llmgw-control running? use --admin URL)", True),
        ("useradd --home-dir /var/lib/llmgw-node --no-create-home llmgw", True),
        ("uv build --wheel --package llmgw-node --out-dir dist", True),
        ("llmgw-control release --files-dir /srv/files prepare --python 3.12 --arch x86_64", True),
        ("llmgw-control release prepare --no-such-flag", False),
        ("llmgw-control release rollback", False),
        ('die "$dir: llmgw-node --version failed: $got"', True),
        ("llmgw-node --nope --version", False),
    ],
)
def test_the_checker_itself(line: str, ok: bool) -> None:
    found = [check_command(program, words) for _, program, words in commands_in(line)]
    assert (found == [] or found == [None]) is ok, found
