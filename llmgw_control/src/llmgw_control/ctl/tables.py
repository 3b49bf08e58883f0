"""Plain-text tables for people (``--json`` prints the API's answer instead)."""

from __future__ import annotations

from collections.abc import Sequence

from .terminal import escape


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; the last column is not padded (it may be long)."""
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers), *cells]:
        parts = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    # A cell is one line: a line break in a name from a node or the Hub would fake a row.
    return escape(str(value), keep="")


def mib(value: int) -> str:
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value} MiB"
