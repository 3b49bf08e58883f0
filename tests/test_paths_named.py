"""Every file a comment, a doc or a pyproject names exists: a reader sent to a file finds it.

A rename leaves its old name behind in prose, where no import breaks: ``http_connection.py``,
``catalog/hub.py`` and ``router/activator.py`` were named long after they had moved. Names are
taken from the docs, the README, the pyproject files and every comment and docstring of the
Python sources; a name is found when some file of the tree ends with it (``gateway/relay.py``
is ``llmgw_control/src/llmgw_control/gateway/relay.py``).
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A Python module by its name, or any other file by a path with at least one folder in it.
_PY = re.compile(r"(?<![\w./~-])((?:[\w-]+/)*[\w-]+\.py)\b")
_PATHED = re.compile(r"(?<![\w./~:-])((?:[\w.-]+/)+[\w-]+\.(?:md|toml|txt|json|sh|service|js|css|html|yml|yaml))\b")
# Names that are not files of this tree: what the daemons write at run time, or other projects'.
_NOT_OURS = re.compile(
    r"^(proxy/process\.py|setup\.py|conftest\.py|__init__\.py|__main__\.py|"
    r".*_highlevel_serve_listeners\.py|_state\.py|.*connection_pool\.py|http11\.py|"
    r"release\.yml|.*/release\.yml)$"
)


def _tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in listed.splitlines() if line]


FILES = _tracked()
SUFFIXES = {"/" + f for f in FILES} | set(FILES)


def _exists(name: str) -> bool:
    while name.startswith(("../", "./")):  # a link relative to a doc
        name = name.split("/", 1)[1]
    return name in SUFFIXES or any(f.endswith("/" + name) for f in FILES)


def _prose(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".py":
        return text
    parts = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                parts.append(token.string)
            elif token.type == tokenize.STRING and token.string.lstrip("rRbBuU").startswith(('"""', "'''")):
                parts.append(token.string)  # docstrings and other block text
    except (tokenize.TokenError, SyntaxError):
        return text
    return "\n".join(parts)


def _sources() -> list[str]:
    # This file names missing files on purpose, as examples.
    return [
        f
        for f in FILES
        if f.endswith((".py", ".md", "pyproject.toml"))
        and not f.startswith("bench/results/")
        and f != "tests/test_paths_named.py"
    ]


def _named(text: str) -> set[str]:
    found = set(_PY.findall(text)) | set(_PATHED.findall(text))
    return {name for name in found if not _NOT_OURS.match(name)}


def test_the_scan_finds_names() -> None:
    assert _named("see gateway/relay.py and docs/security.md, not https://x.org/a.md") == {
        "gateway/relay.py",
        "docs/security.md",
    }
    assert _named("# the h11 loop of http_connection.py") == {"http_connection.py"}
    assert len(_sources()) > 100


@pytest.mark.parametrize("source", _sources())
def test_every_file_named_exists(source: str) -> None:
    missing = sorted(name for name in _named(_prose(ROOT / source)) if not _exists(name))
    assert not missing, f"{source} names files that do not exist: {missing}"
