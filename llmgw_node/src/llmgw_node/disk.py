"""Free space on the data disk: what an install or a download may use, and what it must leave.

A full disk breaks more than the write that filled it: logs, the replica state file and the
engines themselves (llama-server writes its slot files there) fail next. Every writer that takes
a size from the network (model weights, engine archives, what an archive unpacks to) checks
here first that the size fits with a margin left over.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from llmgw_node.fetch import human_size

# Kept free after any download or unpack: room for logs and state files to go on being written
# (a day of an engine's log at debug level is well under this), the precedent being ext4's
# 5% reserve, which root-run daemons do not get.
DISK_MARGIN = 256 << 20


class NotEnoughDisk(Exception):
    """The disk does not have room for what is about to be written; the text says how much."""


def free_bytes(directory: Path) -> int:
    return shutil.disk_usage(directory).free


def check_room(directory: Path, need: int, what: str, *, margin: int = DISK_MARGIN, free: int | None = None) -> None:
    """Refuse (``NotEnoughDisk``) when ``need`` bytes plus ``margin`` do not fit in ``directory``."""
    free = free_bytes(directory) if free is None else free
    total = max(0, need) + margin
    if total > free:
        raise NotEnoughDisk(
            f"not enough disk for {what}: needs {human_size(total)} (with {human_size(margin)} "
            f"kept free), {human_size(free)} free in {directory}"
        )
