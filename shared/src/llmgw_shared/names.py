"""Every kind of name that arrives from the network, each with one pattern, checked in one place.

A name that reaches a path, a shell command, a log line or a metric label is checked here first,
by both daemons and both CLIs, so the rules cannot drift apart. Patterns are matched whole
(``fullmatch``): ``re.match`` with ``$`` also accepts a trailing newline, which is how a node id
with a newline was once welcomed.

Every pattern below starts with a letter or digit and has no ``/``, so a name that passes is one
plain path component that is never ``.``, ``..`` or hidden, and needs no quoting anywhere.
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

# Engine names (llama.cpp, vllm, sglang) name the folder <data_dir>/engines/<name>. 32 is four
# times the longest engine name in use and keeps the install path short.
ENGINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,31}")
ENGINE_NAME_RULE = "1-32 letters, digits, '.', '_' or '-', starting with a letter or digit"

# Engine versions (llama.cpp's b11312, vLLM's 0.11.0, a local build's 0.11.0+cu124) name the
# folder <data_dir>/engines/<name>/<version>; "." or "" would name the engine's own folder, which
# an install replaces. 64 is room for any release tag in use.
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\-]{0,63}")
VERSION_RULE = "1-64 letters, digits, '.', '_', '+' or '-', starting with a letter or digit"

# Replica ids name the engine's log file (<data_dir>/shards/<id>.log) and appear in metric labels.
REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,127}")
REPLICA_ID_RULE = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"

# Release asset names (llama-b11312-bin-ubuntu-x64.tar.gz) are saved as
# <data_dir>/engines/.downloads/<16 hex>-<name>.part, which must fit one NAME_MAX (255 bytes):
# 200 leaves room for the 22 characters around it. GitHub itself renames uploads to this
# alphabet ("special characters" become '.'), so no real release is refused by it.
ASSET_NAME = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._+\-]{0,199}")
ASSET_NAME_RULE = (
    "a plain file name: 1-200 letters, digits, '.', '_', '+' or '-', starting with a letter or digit, without '..'"
)

# Model weight file names (the last part of a weights URL: Qwen2.5-7B-Instruct-Q4_K_M.gguf) are
# shown in progress and error lines; the file itself is stored under its digest. NAME_MAX long.
WEIGHT_FILE_NAME = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._+\-]{0,254}")
WEIGHT_FILE_NAME_RULE = (
    "a plain file name: 1-255 letters, digits, '.', '_', '+' or '-', starting with a letter or digit, without '..'"
)

# A sha256 in hex (weights, remove_weights), and a published digest as GitHub writes it
# ("sha256:<hex>"); both name files, so nothing but 64 hex digits may reach a path.
SHA256 = re.compile(r"[0-9a-fA-F]{64}")
SHA256_RULE = "64 hex digits"
DIGEST = re.compile(r"sha256:([0-9a-fA-F]{64})")
DIGEST_RULE = "'sha256:' and 64 hex digits"


def check_node_id(value: object) -> str:
    """``value`` when it is a valid node id; ``BadName`` naming the rule otherwise."""
    return _check("node id", NODE_ID, NODE_ID_RULE, value)


def check_engine_name(value: object) -> str:
    """``value`` when it is a valid engine name; ``BadName`` naming the rule otherwise."""
    return _check("engine name", ENGINE_NAME, ENGINE_NAME_RULE, value)


def check_version(value: object, kind: str = "version") -> str:
    """``value`` when it is a valid engine version; ``BadName`` naming ``kind`` and the rule otherwise."""
    return _check(kind, VERSION, VERSION_RULE, value)


def check_replica_id(value: object) -> str:
    """``value`` when it is a valid replica id; ``BadName`` naming the rule otherwise."""
    return _check("replica id", REPLICA_ID, REPLICA_ID_RULE, value)


def check_asset_name(value: object) -> str:
    """``value`` when it is a valid release asset name; ``BadName`` naming the rule otherwise."""
    return _check("asset name", ASSET_NAME, ASSET_NAME_RULE, value)


def check_weight_file_name(value: object) -> str:
    """``value`` when it is a valid weight file name; ``BadName`` naming the rule otherwise."""
    return _check("weight file name", WEIGHT_FILE_NAME, WEIGHT_FILE_NAME_RULE, value)


def check_sha256(value: object) -> str:
    """The lower-case hex of a sha256 given as 64 hex digits; ``BadName`` otherwise."""
    return _check("sha256", SHA256, SHA256_RULE, value).lower()


def check_digest(value: object) -> str:
    """The lower-case hex of a ``sha256:<64 hex>`` digest; ``BadName`` otherwise."""
    match = DIGEST.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise BadName(f"digest {shown(value)} is not valid: use {DIGEST_RULE}")
    return match[1].lower()


def _check(kind: str, pattern: re.Pattern[str], rule: str, value: object) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise BadName(f"{kind} {shown(value)} is not valid: use {rule}")
    return value


def shown(value: object, limit: int = 80) -> str:
    """A hostile value, quoted and cut so that it cannot flood or forge a log line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# A DNS name (RFC 1123 labels, 253 characters in all); an IP literal is checked by ipaddress.
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?")
ADDRESS_RULE = "a host name or an IP address, without a port, scheme or path"


def check_address(value: object) -> str:
    """Where a node's engines are reached: a host name or an IP literal (IPv6 with or without brackets).

    It becomes the host of the URLs control sends requests (and the replicas' keys) to, so nothing
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
    raise BadName(f"address {shown(value)} is not valid: use {ADDRESS_RULE}")
