"""The docs say what is true now: no diary of runs and fixes in docs/ or the README.

A page that narrates ("before the fix", "we found", "it once ...", "on 4 December") tells a reader
what happened on a day, not what the code does; the history is in git and in ``bench/results/``.
Each phrase below marks narration; the allowlist holds the few places where the same words say
something true now.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])

_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
DIARY = re.compile(
    r"\b(?:before|after) the fix\b"
    r"|\blast round\b|\bthis session\b|\bthis (?:afternoon|morning|evening)\b|\byesterday\b|\btoday\b"
    r"|\bwe (?:found|saw|measured|tried|had|did|first)\b"
    r"|\b(?:it|that|which|they) once\b"
    r"|(?<!at )\bonce \w+ed\b"  # "once crashed"; not "answered at once included", "once per"
    rf"|\b\d{{1,2}} (?:{_MONTHS})\b|\b(?:{_MONTHS}) \d{{1,2}}\b"
    r"|\bwas red\b|\(CI once\)",
    re.IGNORECASE,
)

# (page, the line's text around the phrase): where the words say what is true now.
ALLOWED: set[tuple[str, str]] = set()


def _hits(page: Path) -> list[str]:
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for match in DIARY.finditer(line):
            if not any(page.name == name and text in line for name, text in ALLOWED):
                found.append(f"{page.name}:{number}: {match.group(0)!r} in {line.strip()[:120]!r}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_page_says_what_is_true_now(page: Path) -> None:
    assert _hits(page) == []


@pytest.mark.parametrize(
    "line",
    [
        "before the fix both failed",
        "a connection it once handed to two requests",
        "measured on 4 December",
        "December 3, after the run",
        "the node once crashed here",
        "we found",
    ],
)
def test_the_diary_phrases_are_caught(line: str) -> None:
    assert DIARY.search(line), line


@pytest.mark.parametrize(
    "line",
    [
        "answered at once",
        "shown once",
        "once per request",
        "once the file is pulled",
        "sent at once included",
    ],
)
def test_what_is_true_now_is_not_caught(line: str) -> None:
    assert DIARY.search(line) is None, line
