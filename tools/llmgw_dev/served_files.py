"""Putting a file into control's files_dir the way an operator may: a hard link, else a copy.

Control serves nothing whose real path leaves the directory it is served from (a symlink to a
file elsewhere is refused), so the demo and the tests place the cached engine archive, model and
wheels in the tree itself: a hard link costs nothing on the same filesystem, and a copy works
across filesystems.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def place(source: Path, target: Path) -> Path:
    """``target`` holding ``source``'s bytes (replacing what was there); returns ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed there
        shutil.copy2(source, target)
    return target
