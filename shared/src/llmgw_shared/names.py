"""Every kind of name that arrives from the network, each with one pattern, checked in one place.

A name that reaches a path, a shell command, a log line or a metric label is checked here first,
by both daemons and both CLIs, so the rules cannot drift apart. Patterns are matched whole
(``fullmatch``): ``re.match`` with ``$`` also accepts a trailing newline, which is how a node id
with a newline was once welcomed.
"""

from __future__ import annotations

import ipaddress
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


# Shard ids name a log file and a state file on the node, a replica in control's router and its
# metric labels; control makes them as "<model>-<profile>-<8 hex>" (at most 109 characters).
# The pattern is the node supervisor's, which refuses to start anything else.
SHARD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,127}")
SHARD_ID_RULE = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"

# Engine names and versions ("llama.cpp b11312", "vllm 0.6.3.post1") are matched against the
# catalog, shown in tables and logs and put in metric labels; '+' for local version tags.
ENGINE_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\-]{0,63}")
ENGINE_WORD_RULE = "1-64 letters, digits, '.', '_', '+' or '-', starting with a letter or digit"

# A DNS name (RFC 1123 labels, 253 characters in all); an IP literal is checked by ipaddress.
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?")
ADDRESS_RULE = "a host name or an IP address, without a port, scheme or path"


def check_shard_id(value: object) -> str:
    """``value`` when it is a valid shard id; ``BadName`` naming the rule otherwise."""
    if not isinstance(value, str) or not SHARD_ID.fullmatch(value):
        raise BadName(f"shard id {_shown(value)} is not valid: use {SHARD_ID_RULE}")
    return value


def check_engine_word(value: object, what: str = "engine name") -> str:
    """An engine's name or version (``what`` says which), or ``BadName`` naming the rule."""
    if not isinstance(value, str) or not ENGINE_WORD.fullmatch(value):
        raise BadName(f"{what} {_shown(value)} is not valid: use {ENGINE_WORD_RULE}")
    return value


def check_address(value: object) -> str:
    """Where a node's engines are reached: a host name or an IP literal (IPv6 with or without brackets).

    It becomes the host of the URLs control sends requests (and the shards' keys) to, so nothing
    that would change a URL's meaning passes: no port, userinfo, path, zone id or whitespace.
    """
    if isinstance(value, str) and 0 < len(value) <= 253:
        literal = value[1:-1] if value.startswith("[") and value.endswith("]") else value
        try:
            ipaddress.ip_address(literal)
        except ValueError:
            if literal is value and HOST_NAME.fullmatch(value):
                return value
        else:
            if "%" not in literal:
                return value
    raise BadName(f"address {_shown(value)} is not valid: use {ADDRESS_RULE}")
