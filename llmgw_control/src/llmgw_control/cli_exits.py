"""How control's offline commands (``release``, ``engines``) end on an error: one line, one exit code.

Both make files for nodes from control's config, so both stop on the same three kinds of error.
"""

from __future__ import annotations

import sys

from llmgw_shared.config import ConfigError

from .fleet.node_release import NodeReleaseError

# What the commands stop on: a refused release or pin, a wrong config, a file they could not use.
FAILURES = (NodeReleaseError, ConfigError, OSError)
# The exit codes: the work was refused or failed (1); control's config is wrong (2), which a
# script running the command may tell apart from a failed fetch.
FAILED = 1
BAD_CONFIG = 2


def stopped(command: str, exc: NodeReleaseError | ConfigError | OSError) -> int:
    """Say on stderr why ``llmgw-control <command>`` stopped; its exit code."""
    if isinstance(exc, OSError):
        print(
            f"llmgw-control {command}: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}",
            file=sys.stderr,
        )
        return FAILED
    print(f"llmgw-control {command}: {exc}", file=sys.stderr)
    return BAD_CONFIG if isinstance(exc, ConfigError) else FAILED
