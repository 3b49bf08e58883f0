"""Fleet writes on a standby: refused, naming the leader, rather than forwarded to it.

Drain, cordon, uncordon, capacity runs, replica logs and the nodes' weights need the leader's
in-memory fleet or its connections to nodes. A standby answers them with ``StandbyRefusal``:
409 ``standby`` with the leader's address in ``error.leader`` and in ``x-llmgw-leader``, or 503
``standby`` with ``Retry-After`` while no leader is known. docs/failover.md says why we do not
forward (a standby would hold the caller's admin key and hide which daemon acted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..api_errors import AdminApiError

if TYPE_CHECKING:
    from ..fleet.fleet import Fleet

# The header every admin answer of a standby carries, and the one the client API's standby 503 uses.
LEADER_HEADER = "x-llmgw-leader"
# Seconds a caller should wait when no leader is known (a takeover under way: the standby polls
# the lease every 0.5 s, so a second covers one change of leader).
NO_LEADER_RETRY_S = 1


class StandbyRefusal(AdminApiError):
    """A fleet write on a standby: 409 ``standby`` naming the leader, or 503 ``standby`` with
    ``Retry-After`` while no leader is known."""

    def __init__(self, action: str, leader: str | None) -> None:
        if leader:
            super().__init__(409, "standby", f"this control daemon is a standby: {action} on the leader ({leader})")
            self.headers: tuple[tuple[str, str], ...] = ((LEADER_HEADER, leader),)
        else:
            super().__init__(
                503,
                "standby",
                f"this control daemon is a standby and no leader is known right now: "
                f"{action} on the leader once one leads (retry in a moment)",
            )
            self.headers = (("retry-after", str(NO_LEADER_RETRY_S)),)
        self.leader = leader


def standby_leader(fleet: Fleet | None) -> tuple[bool, str | None]:
    """(whether this daemon is a standby, the leader's address it knows of)."""
    if fleet is None:
        return False, None
    role = fleet.agents.role
    return (not role.leader), role.leader_address


def refuse_on_standby(fleet: Fleet | None, action: str) -> None:
    """Raise ``StandbyRefusal`` when this daemon is a standby (before anything is looked up or
    written: the leader decides, and answers 404 for a node it does not know)."""
    standby, leader = standby_leader(fleet)
    if standby:
        raise StandbyRefusal(action, leader)
