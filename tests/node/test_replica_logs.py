"""A replica's output ring (its log file) as the node reads it for control: bounded, with a cursor."""

from __future__ import annotations

import json
import os
from pathlib import Path

from llmgw_node import replica_logs
from llmgw_node.replica_logs import MAX_ANSWER_BYTES, MAX_LINE_CHARS, MAX_LINES, read_output, rotate_if_large


def write(path: Path, text: str | bytes, mode: str = "a") -> None:
    data = text.encode() if isinstance(text, str) else text
    with open(path, mode + "b") as handle:
        handle.write(data)


def test_last_lines_then_only_what_came_after_the_cursor(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    write(log, "".join(f"line {i}\n" for i in range(10)))
    first = read_output(log, 3)
    assert first.lines == ["line 7", "line 8", "line 9"]
    assert read_output(log, 3, first.cursor).lines == []  # nothing new
    write(log, "line 10\nline 1")  # the second line is still being written
    second = read_output(log, 100, first.cursor)
    assert second.lines == ["line 10"]
    write(log, "1\n")
    assert read_output(log, 100, second.cursor).lines == ["line 11"]


def test_a_truncated_or_replaced_file_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    write(log, "old 1\nold 2\n")
    cursor = read_output(log, 10).cursor
    os.truncate(log, 0)
    write(log, "new 1\n")
    assert read_output(log, 10, cursor).lines == ["new 1"]
    cursor = read_output(log, 10).cursor
    os.replace(log, tmp_path / "s.log.1")
    write(log, "fresh\n")  # another inode, shorter: a restart's fresh log
    assert read_output(log, 10, cursor).lines == ["fresh"]
    # Garbage cursors are only "no cursor".
    assert read_output(log, 10, "x:y").lines == ["fresh"]
    assert read_output(tmp_path / "none.log", 10).lines == []


def test_lines_are_bounded_in_count_length_and_control_characters(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    write(log, "".join(f"{i}\n" for i in range(MAX_LINES + 50)))
    assert len(read_output(log, 10**6).lines) == MAX_LINES
    assert read_output(log, 0).lines == [str(MAX_LINES + 49)]  # at least one line
    write(log, "x" * 50_000 + "\n" + "loading 10%\rloading 100%\n" + "bell\x07 \x1b[31mred\ttab\n", "w")
    lines = read_output(log, 10).lines
    assert len(lines[0]) == MAX_LINE_CHARS and lines[0].endswith("…")
    assert lines[1] == "loading 100%"
    assert lines[2] == "bell? ?[31mred\ttab"


def test_an_answer_fits_its_byte_budget_even_when_json_escapes_swell_it(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    # Invalid UTF-8 becomes U+FFFD, six bytes each as JSON: 256 KiB of it would be 1.5 MB.
    write(log, (b"\xff" * 1000 + b"\n") * 300)
    lines = read_output(log, MAX_LINES).lines
    assert lines and sum(len(json.dumps(line)) + 1 for line in lines) <= MAX_ANSWER_BYTES


def test_a_running_engines_log_is_rotated_once_large(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # as the engine holds it
    try:
        os.write(fd, b"a" * 100 + b"\n")
        assert not rotate_if_large(log, limit=1000)
        os.write(fd, b"b" * 1000 + b"\n")
        assert rotate_if_large(log, limit=1000)
        assert log.stat().st_size == 0 and (tmp_path / "s.log.1").stat().st_size == 1102
        assert (tmp_path / "s.log.1").stat().st_mode & 0o777 == 0o600
        os.write(fd, b"after\n")  # O_APPEND: at the new end, no hole
        assert log.read_bytes() == b"after\n"
    finally:
        os.close(fd)
    assert replica_logs.LOG_KEEP_BYTES > 0
