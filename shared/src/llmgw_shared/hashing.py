"""SHA-256 of files: the one reader both daemons hash engine archives, model files and wheels with.

Blocking: call it in a thread of the ``FILES`` pool (``llmgw_shared.threads``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

# A file is read in blocks of 1 MiB: the per-read cost vanishes against hashing that much, and a
# model file of many GiB is hashed in flat memory.
BLOCK = 1 << 20


def update_from_file(digest: Any, path: Path) -> None:
    """Feed the whole of ``path`` to ``digest`` (a ``hashlib`` object), e.g. to resume a download's hash."""
    with open(path, "rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    update_from_file(digest, path)
    return digest.hexdigest()
