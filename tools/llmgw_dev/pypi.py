"""Fetching one pinned file from PyPI with nothing but the standard library.

The bootstrap (``dev.py``) and the engine build run before any virtual environment exists -- a
fresh Debian has no pip unless python3-pip is installed -- so they use PyPI's simple index
(PEP 691 JSON) directly and verify every file against a pinned or index-published sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import urllib.request
from pathlib import Path

INDEX = os.environ.get("LLMGW_PYPI_SIMPLE", "https://pypi.org/simple")


def say(message: str) -> None:
    print(f"[llmgw] {message}", file=sys.stderr, flush=True)


def release_files(project: str) -> list[dict[str, object]]:
    request = urllib.request.Request(f"{INDEX}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files: list[dict[str, object]] = json.load(response)["files"]
    return files


def find_file(project: str, filename: str) -> tuple[str, str]:
    """(url, sha256) of one file of ``project`` as the index lists it."""
    for entry in release_files(project):
        if entry["filename"] == filename:
            hashes = entry.get("hashes")
            sha256 = hashes.get("sha256", "") if isinstance(hashes, dict) else ""
            return str(entry["url"]), str(sha256)
    raise SystemExit(f"PyPI lists no file {filename} for {project}")


def download(url: str, target: Path, *, expected_sha256: str, label: str) -> None:
    """Download to ``target`` with progress, refusing a file whose sha256 differs."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
        total = int(response.headers.get("content-length") or 0)
        done = 0
        reported = -1
        while block := response.read(1 << 20):
            out.write(block)
            digest.update(block)
            done += len(block)
            tenth = done * 10 // total if total else 0
            if tenth != reported:
                reported = tenth
                say(f"downloading {label}: {done / 1e6:.0f} MB ({tenth * 10}%)")
    if digest.hexdigest() != expected_sha256:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"{label}: sha256 {digest.hexdigest()} differs from the expected {expected_sha256}")
    os.replace(partial, target)
