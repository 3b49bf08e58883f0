"""Every kind of name that arrives from the network, each with one pattern, checked in one place.

A name that reaches a path, a shell command, a log line or a metric label is checked here first,
by both daemons and both CLIs, so the rules cannot drift apart. Patterns are matched whole
(``fullmatch``): ``re.match`` with ``$`` also accepts a trailing newline, which is how a node id
with a newline was once welcomed.
"""

from __future__ import annotations

import re


class BadName(ValueError):
    """A name that does not match its kind's pattern; the message says which kind and what is allowed."""


# Node ids go into a shell command, a file name, log lines and metric labels: a conservative
# alphabet that needs no quoting anywhere, at most a DNS label's 63 characters.
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,62}")
NODE_ID_RULE = "1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"


def check_node_id(value: object) -> str:
    """``value`` when it is a valid node id; ``BadName`` naming the rule otherwise."""
    if not isinstance(value, str) or not NODE_ID.fullmatch(value):
        raise BadName(f"node id {_shown(value)} is not valid: use {NODE_ID_RULE}")
    return value


def _shown(value: object, limit: int = 80) -> str:
    """A hostile value, quoted and cut so that it cannot flood or forge a log line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
