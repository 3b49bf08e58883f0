"""An engine's install status on a node, and the transitions between statuses: one table.

The node's engine manager (llmgw_node/engines/manager.py) records and reports one status per
(engine, version) in the wire's words (``wire.EngineStatus``); control reads them to place
replicas only where an engine is ``installed`` or ``configured``. Every change goes through the
manager's ``_set``, which checks this table first: a transition it forbids is a bug in the node,
logged as an error and refused (the engine keeps its status, nothing is sent), because a node
daemon must not die for one engine's bookkeeping.

The lifecycle has no end but ``unconfigured``: an installed engine is re-checked for as long as
the daemon runs, and a failed one retried, so they cycle; ``unconfigured`` (an engine the node
can only run when its config names it by path) holds until the daemon restarts with a new config.
"""

from __future__ import annotations

from enum import StrEnum

from llmgw_shared.transitions import Lifecycle
from llmgw_shared.wire import EngineStatus


class EngineInstall(StrEnum):
    # Nothing known of it here: not installed, not configured, not asked for yet.
    ABSENT = "absent"
    INSTALLING = "installing"
    # Installed from a release here, and proven to run.
    INSTALLED = "installed"
    FAILED = "failed"
    # Named by path in the node's config, and proven to run.
    CONFIGURED = "configured"
    # Asked for, but an engine the node cannot install and its config does not name.
    UNCONFIGURED = "unconfigured"


ENGINE_LIFECYCLE = Lifecycle(
    "engine install",
    EngineInstall,
    start={EngineInstall.ABSENT},
    transitions={
        # Asked for (queued), found installed or configured at start-up, proven broken at start-up,
        # or one this node has no way to run.
        EngineInstall.ABSENT: {
            EngineInstall.INSTALLING,
            EngineInstall.INSTALLED,
            EngineInstall.FAILED,
            EngineInstall.CONFIGURED,
            EngineInstall.UNCONFIGURED,
        },
        EngineInstall.INSTALLING: {EngineInstall.INSTALLED, EngineInstall.FAILED},
        # A re-check failed (a library gone, the binary deleted).
        EngineInstall.INSTALLED: {EngineInstall.FAILED},
        # Retried (with backoff), or a configured engine that proves itself again.
        EngineInstall.FAILED: {EngineInstall.INSTALLING, EngineInstall.CONFIGURED},
        EngineInstall.CONFIGURED: {EngineInstall.FAILED},
        EngineInstall.UNCONFIGURED: set(),
    },
)

# Where control may place a replica that needs the engine.
SERVES = frozenset({EngineInstall.INSTALLED, EngineInstall.CONFIGURED})


def on_wire(status: EngineInstall) -> EngineStatus:
    """The wire's spelling of a status (the same string: the enum's values are the wire's)."""
    return status.value
