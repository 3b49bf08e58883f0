"""JSON from the network, parsed with a bound on its nesting depth: the one parser every listener uses.

Python's ``json`` has no depth limit of its own. The C scanner recurses once per ``[`` or ``{``
and stops with a ``RecursionError`` near the interpreter's recursion limit (1000 frames), which
every caller then has to know to catch -- the admin API did not, and answered a body nested
100,000 deep with a 500; the agent socket dropped the node's session with a traceback. A value
that parses a few frames short of that limit is worse: the next recursive step (cattrs
structuring it, ``json.dumps`` re-encoding it for an engine) raises deeper in the stack, far
from any handler that expects it.

``loads`` refuses anything nested deeper than ``MAX_DEPTH`` with :class:`JsonTooDeep` (a
``ValueError``, so callers that already catch malformed JSON catch it too), whatever the stack
depth of the caller, and before parsing it. The check is made to cost next to nothing on the
client API's hot path (bench/json_depth.py measures it):

* A document with at most ``max_depth`` brackets in all cannot nest deeper than that: two
  ``bytes.count`` calls clear every ordinary request (a chat of up to ~60 messages).
* Otherwise the depth is read from the text with C-speed ``bytes`` operations only: escapes
  removed, everything but brackets and quotes deleted, string contents dropped, then innermost
  pairs removed round by round (a round per level: a handful for real documents), and whatever
  is left after a few rounds measured in one pass. A walk over the parsed value in Python costs
  about as much as the parse itself; this costs a fraction of it, and at worst (megabytes of
  chains just under the limit) about what parsing them costs.

``NaN``, ``Infinity`` and ``-Infinity`` are refused too: Python accepts them, JSON does not, and
an engine that receives one back from us fails to parse it (llama-server answers such a body
with a 500, which would look like an unwell engine).
"""

from __future__ import annotations

import json
import operator
from itertools import accumulate, count
from typing import Any

# The deepest nesting accepted. serde_json's default recursion limit (128) is the precedent: deep
# enough for any real document (an OpenAI request with a JSON schema in its tools nests ~20 deep,
# our wire frames 5), and far enough below Python's recursion limit that whatever recurses over
# the parsed value afterwards (cattrs, json.dumps) has room to do it.
MAX_DEPTH = 128


class JsonTooDeep(ValueError):
    """A document nested deeper than the limit; the message says the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nested deeper than {limit} levels is not accepted")
        self.limit = limit


class JsonConstantRefused(ValueError):
    """``NaN`` or ``Infinity``: Python's extension, not JSON."""


def _refuse_constant(name: str) -> Any:
    raise JsonConstantRefused(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def loads(data: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH) -> Any:
    """The value in ``data``; ``ValueError`` (``JsonTooDeep`` for nesting) when it is not acceptable JSON.

    Bytes must be UTF-8 (``UnicodeDecodeError`` is a ``ValueError`` too).
    """
    if isinstance(data, str):
        if data.count("[") + data.count("{") > max_depth and nesting_exceeds(
            data.encode("utf-8", "surrogatepass"), max_depth
        ):
            raise JsonTooDeep(max_depth)
        text = data
    else:
        if data.count(b"[") + data.count(b"{") > max_depth and nesting_exceeds(bytes(data), max_depth):
            raise JsonTooDeep(max_depth)
        # RFC 8259 8.1: JSON between systems is UTF-8; a leading byte order mark may be ignored.
        text = data.decode("utf-8-sig")
    try:
        return _DECODER.decode(text)
    except RecursionError:  # cannot happen below the limit; kept so that it could never be a 500
        raise JsonTooDeep(max_depth) from None


# Everything but brackets and quotes is deleted; braces count as brackets.
_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"')
_BRACES_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
# '[' is 2 and ']' is 0, so the running sum of (value - 1) is the depth at each bracket.
_STEPS = bytes.maketrans(b"[]", b"\x02\x00")
# Rounds of removing innermost pairs before the rest is measured in one pass: real documents
# nest fewer levels than this and are done in the rounds, which are the cheaper way for them.
_ROUNDS = 8


def nesting_exceeds(text: bytes, limit: int) -> bool:
    """Whether the JSON document ``text`` nests arrays and objects deeper than ``limit``.

    Exact for valid JSON; for anything else the answer only has to be one the parser then
    refuses or accepts correctly, since the parser still runs.
    """
    if b"\\" in text:
        # In a valid document a backslash appears only in strings, each starting an escape of
        # one character: drop escaped backslashes first, then escaped quotes, and every quote
        # left delimits a string.
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    shape = text.translate(_BRACES_AS_BRACKETS, _STRUCTURE)
    # Adjacent quotes are an empty string or the end of one and the start of the next: removing
    # them keeps every other character inside or outside a string, as it was.
    shape = shape.replace(b'""', b"")
    if b'"' in shape:
        shape = b"".join(shape.split(b'"')[::2])  # the even pieces lie outside strings
    if b"[" * (limit + 1) in shape:
        return True
    depth = 0
    while shape and depth < min(_ROUNDS, limit):
        pruned = shape.replace(b"[]", b"")
        if len(pruned) == len(shape):
            return False  # unbalanced: not JSON, and the parser will say so
        shape, depth = pruned, depth + 1
    if not shape:
        return depth > limit
    deepest: int = max(map(operator.sub, accumulate(shape.translate(_STEPS)), count(1)))
    return depth + deepest > limit
