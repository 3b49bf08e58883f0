"""What the agent service tells the control plane of its nodes, through an object built first.

The agent service and the reconciler need each other: the reconciler sends its commands through
the service, and the service reports changes and each command's fate to the reconciler, fencing
the commands with its lease epoch. ``NodeEvents`` is built before both and handed to each in its
constructor: the service tells it, the reconciler listens from its own construction, and nothing
is wired after either is built.
"""

from __future__ import annotations

from typing import Protocol

from llmgw_shared.wire import Command


class Outcomes(Protocol):
    """A listener (``reconciler.Reconciler``): changes, commands' fates, and its fencing token."""

    fencing_token: int

    def wake(self) -> None: ...
    def command_failed(self, node_id: str, command: Command, reason: str) -> None: ...
    def command_unsent(self, node_id: str, command: Command) -> None: ...


# The fencing token of commands sent with no listener (a test of the service alone): a node
# accepts the first token it sees.
NO_LEADER_TOKEN = 1


class NodeEvents:
    def __init__(self) -> None:
        self._listeners: list[Outcomes] = []

    def listen(self, listener: Outcomes) -> None:
        self._listeners.append(listener)

    def changed(self) -> None:
        """A node connected, reported or went away."""
        for listener in self._listeners:
            listener.wake()

    def command_failed(self, node_id: str, command: Command, reason: str) -> None:
        for listener in self._listeners:
            listener.command_failed(node_id, command, reason)

    def command_unsent(self, node_id: str, command: Command) -> None:
        """``command`` never left control: its node's connection ended first (the node cannot have it)."""
        for listener in self._listeners:
            listener.command_unsent(node_id, command)

    def fencing_token(self) -> int:
        """The token commands carry: the leader lease's epoch as the reconciler holds it (the highest,
        should a test listen twice)."""
        return max((listener.fencing_token for listener in self._listeners), default=NO_LEADER_TOKEN)
