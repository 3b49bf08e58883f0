"""A replica's output as the operator reads it: the last lines, and what came after a cursor.

The ring of each replica's output is its log file (``<data_dir>/shards/<id>.log``), not a list in
memory: the engine writes there directly, because a pipe to the daemon would break it with
SIGPIPE the moment the daemon restarts, and an engine adopted by the next daemon keeps writing to
the same file. The file is bounded: it is rotated (one old file kept) when a replica starts and,
while the replica runs, copied aside and truncated once it passes ``LOG_KEEP_BYTES``
(``rotate_if_large``), so the ring holds between one and two times that.

What leaves the node is bounded too: at most ``MAX_LINES`` lines, each cut to ``MAX_LINE_CHARS``,
read from the file's last ``MAX_READ_BYTES``. A cursor (``<inode>:<offset>``) says where the
previous answer ended, so a follower asks for what came after it; a file that was rotated or
truncated since (another inode, or shorter than the offset) is read from its start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import attrs

from llmgw_node.procs import LOG_KEEP_BYTES

# Lines one request may return: a screenful of context for a failure is 30, an operator reading
# back through a start-up (vLLM logs ~200 lines loading a model) wants hundreds; 1000 is the wire's
# limit on any list (llmgw_shared.wire.MAX_ITEMS).
MAX_LINES = 1000
# A line longer than this is cut (a progress bar redrawn with \r, a JSON dump on one line): the
# wire bounds every string at 8192 characters, and 2000 keeps 1000 lines under 2 MB per frame.
MAX_LINE_CHARS = 2000
# The most of the file one request reads: 1000 lines of a typical 150 bytes, with room.
MAX_READ_BYTES = 256 << 10
# The lines of one answer, as JSON: half of the largest frame control accepts by default
# (agents.max_frame_bytes, 1 MiB), since a frame over it ends the node's connection. Non-ASCII
# output is escaped by JSON (up to six bytes a character), so the raw read alone does not bound it.
MAX_ANSWER_BYTES = 512 << 10
_CURSOR = re.compile(r"^(\d{1,20}):(\d{1,20})$")


@attrs.frozen
class Output:
    lines: list[str]
    # Where this answer ended, for the next request of a follower.
    cursor: str


def _parse_cursor(cursor: str) -> tuple[int, int] | None:
    match = _CURSOR.fullmatch(cursor)
    return (int(match[1]), int(match[2])) if match else None


def read_output(path: Path, lines: int, cursor: str = "") -> Output:
    """The last ``lines`` lines of ``path`` (after ``cursor``, when it still names this file)."""
    lines = max(1, min(lines, MAX_LINES))
    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            size = stat.st_size
            start = max(0, size - MAX_READ_BYTES)
            after = _parse_cursor(cursor)
            cut_first = start > 0
            # The same file, not truncated since, and not so far behind that the tail is all we read.
            if after is not None and after[0] == stat.st_ino and start <= after[1] <= size:
                start, cut_first = after[1], False
            handle.seek(start)
            data = handle.read(size - start)
            inode = stat.st_ino
    except OSError:
        return Output([], "")
    # Only whole lines: a line still being written is read by the next request.
    end = data.rfind(b"\n") + 1
    whole = data[:end]
    # Split on newlines only: splitlines() also splits on \r, which a progress bar redraws with.
    text = [raw.decode(errors="replace") for raw in whole.split(b"\n")[:-1]]
    if cut_first and text:
        text = text[1:]  # the read began inside a line
    out = [_clean(line) for line in text if line.strip()][-lines:]
    return Output(_within_budget(out), f"{inode}:{start + end}")


def _within_budget(lines: list[str]) -> list[str]:
    """The last of ``lines`` whose JSON fits in ``MAX_ANSWER_BYTES``."""
    total = 0
    for keep in range(len(lines) - 1, -1, -1):
        total += len(json.dumps(lines[keep])) + 1
        if total > MAX_ANSWER_BYTES:
            return lines[keep + 1 :]
    return lines


def _clean(line: str) -> str:
    # A progress bar redraws itself with \r: its last state is the line. Control characters
    # other than tab would reach terminals (`ctl replicas logs`) and the page.
    line = line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r")
    line = "".join(c if c == "\t" or c >= " " else "?" for c in line)
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 1] + "…"


def rotate_if_large(path: Path, limit: int = LOG_KEEP_BYTES) -> bool:
    """Copy a running engine's log aside (``.1``) and truncate it once it passes ``limit``.

    The engine holds the file open with O_APPEND, so after the truncation its writes land at the
    new end; the lines written between the copy and the truncation are lost, which is the price
    of not owning the engine's output (see the module docstring).
    """
    try:
        if path.stat().st_size <= limit:
            return False
        old = path.with_name(path.name + ".1")
        old.unlink(missing_ok=True)
        # 0600 as the log itself (open_log): an engine's output may name the operator's paths.
        with open(path, "rb") as src, os.fdopen(os.open(old, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.truncate(path, 0)
    except OSError:
        return False
    return True
