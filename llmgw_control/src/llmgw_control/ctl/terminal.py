"""What ctl writes is safe for a terminal: control characters are shown escaped, never sent.

Much of what ctl prints came from elsewhere: engine log lines and node facts from the nodes,
repository and file names from the Hub, names and messages from the API. A terminal acts on
control characters in any of them (ESC starts sequences that move the cursor, retitle the
window, set the clipboard or replay input; BEL, CR and backspace rewrite what is on screen;
bidi overrides make text read other than it is). ``main`` hands every command a ``TerminalOut``
over stdout and stderr, so everything any command writes passes ``escape`` on its way out; the
sequences ctl means to send (the pull's progress bar) go through ``control``, the one way past.
``--json`` output is JSON, which already writes such characters as ``\\u`` escapes.
"""

from __future__ import annotations

import io
import unicodedata
from typing import TextIO

# Unicode's control (Cc: C0, DEL, C1), format (Cf: bidi overrides and isolates, zero-width
# characters, tags), surrogate (Cs: a lone one from JSON's \ud800 cannot even be encoded) and
# line/paragraph separator (Zl, Zp) categories: what a terminal may act on rather than show.
_UNSAFE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _shown(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape(text: str, *, keep: str = "\n") -> str:
    """``text`` with every control, format, surrogate and separator character but those in
    ``keep`` written as a Python-style escape (ESC as ``\\x1b``, U+202E as ``\\u202e``)."""
    if text.replace(keep, "").isprintable() if keep else text.isprintable():
        return text  # the common case, checked in C
    return "".join(
        _shown(c) if c not in keep and not c.isprintable() and unicodedata.category(c) in _UNSAFE else c for c in text
    )


class TerminalOut(io.TextIOBase, TextIO):
    """A text stream that writes ``escape``d text to ``inner``: line breaks pass, nothing else."""

    def __init__(self, inner: TextIO) -> None:
        super().__init__()
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(escape(text))
        return len(text)

    def control(self, sequence: str) -> None:
        """Write ctl's own terminal sequence as it is (never remote text)."""
        self._inner.write(sequence)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def writable(self) -> bool:
        return True


def control(out: TextIO, sequence: str) -> None:
    """Send ctl's own ``sequence`` (``\\r``, erase to end of line) past the escaping."""
    if isinstance(out, TerminalOut):
        out.control(sequence)
    else:
        out.write(sequence)
