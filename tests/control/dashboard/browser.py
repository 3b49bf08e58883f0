"""Playwright for Python driving Debian's Chromium (``apt-get install chromium``), headless.

No browser download: Playwright's own builds cannot be fetched here, and CI installs the
system package. The sync API runs in a worker thread (``trio.to_thread``), where it keeps its
own asyncio loop away from trio's.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Screenshots are kept as test artifacts (git-ignored), one folder per test.
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "dashboard"


def require_chromium() -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")


@contextmanager
def browser_context() -> Iterator[BrowserContext]:
    """A persistent context on a fresh profile directory (removed afterwards)."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="llmgw-chromium-")
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=ARGS, viewport={"width": 1400, "height": 900}
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def artifacts(name: str) -> Path:
    folder = ARTIFACTS / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
