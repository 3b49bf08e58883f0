"""``GET /api/v1/replicas/{id}/logs``: an engine's output, asked of its node on request.

The node keeps each replica's output (its log file, bounded; ``llmgw_node/replica_logs.py``) and sends
the last lines over the agent socket when asked (``GetReplicaLogs`` -> ``ReplicaLogsReply``). A
follower passes the previous answer's ``cursor`` with ``wait=true``: the answer is held until new
lines appear or ``LOG_WAIT_S`` passes (a long poll: one request at a time per follower, bounded
in time, with nothing held open between polls). A replica whose node is gone, or that was
forgotten after a failure, is answered with the lines its node sent with the failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from ...api_errors import AdminApiError, not_found
from ...fleet.agents import LogsUnavailable
from ..standby_refusal import refuse_on_standby
from .core import Api, Call, Param
from .schemas import ReplicaLogs

if TYPE_CHECKING:
    from ...fleet.fleet import Fleet

# A long poll holds the answer at most this long: under the 30-60 s idle timeouts proxies and
# load balancers put on a quiet request, and short enough that a follower that went away is
# noticed soon after.
LOG_WAIT_S = 20.0
# How often a held poll asks the node again: an engine's line is on the operator's screen within
# about this, and a node answers a poll from a local file read.
LOG_POLL_S = 0.5
# Held polls at once, over all replicas: a few operators and dashboards; more are refused (503)
# instead of each holding a request and polling a node.
MAX_WAITING = 32
DEFAULT_LINES = 100
MAX_LINES = 1000


def register_replica_logs(api: Api, fleet: Callable[[], Fleet]) -> None:
    waiting = [0]

    @api.route(
        "GET",
        "/replicas/{replica_id}/logs",
        summary="The engine's last output lines (follow: wait=true)",
        tag="replicas",
        response=ReplicaLogs,
        errors=(404, 409, 503),
        query=(
            Param("lines", "integer", doc=f"How many lines (1-{MAX_LINES}, default {DEFAULT_LINES})"),
            Param("cursor", doc="The cursor of a previous answer: only lines written after it"),
            Param(
                "wait",
                "boolean",
                doc=f"With cursor: hold the answer until there are new lines (at most {LOG_WAIT_S:g} s)",
            ),
        ),
    )
    async def replica_logs(call: Call) -> ReplicaLogs:
        f = fleet()
        # The engine's output comes from its node, which talks only to the leader.
        refuse_on_standby(f, "read replica logs")
        replica_id = call.path["replica_id"]
        lines = call.query.get("lines", DEFAULT_LINES)
        if not 1 <= lines <= MAX_LINES:
            raise AdminApiError(400, "invalid_request", f"must be between 1 and {MAX_LINES}", "lines")
        cursor = call.query.get("cursor", "")
        if len(cursor) > 41 or not all(c.isdigit() or c == ":" for c in cursor):
            raise AdminApiError(400, "invalid_request", "not a cursor this API gave", "cursor")
        record = f.reconciler.records.get(replica_id)
        ended = f.reconciler.ended.get(replica_id)
        if record is not None:
            profile_key, node_id, status, detail = record.profile_key, record.node_id, str(record.status), record.detail
            report = list(record.last_lines)
        elif ended is not None:
            profile_key, node_id, status, detail = ended.profile_key, ended.node_id, str(ended.status), ended.detail
            report = list(ended.last_lines)
        else:
            raise not_found("replica", replica_id)

        def answer(source: str, out: list[str], next_cursor: str) -> ReplicaLogs:
            return ReplicaLogs(replica_id, profile_key, node_id, status, detail, source, out, next_cursor)

        async def ask(after: str) -> ReplicaLogs | None:
            try:
                got = await f.agents.replica_logs(node_id, replica_id, lines, after)
            except LogsUnavailable as exc:
                if report:
                    return answer("failure report", report[-lines:], "")
                raise AdminApiError(503, "node_unavailable", f"{exc}; no failure report was kept either") from None
            if not got.found:
                return answer("failure report", report[-lines:], "") if report else None
            return answer("node", got.lines, got.cursor)

        first = await ask(cursor)
        if first is None:
            raise AdminApiError(404, "not_found", f"node {node_id} has no output of replica {replica_id}")
        if not call.query.get("wait") or not cursor or first.lines or first.source != "node":
            return first
        if waiting[0] >= MAX_WAITING:
            raise AdminApiError(503, "busy", f"{MAX_WAITING} log followers are waiting already; try again")
        waiting[0] += 1
        try:
            with trio.move_on_after(LOG_WAIT_S):
                while True:
                    await trio.sleep(LOG_POLL_S)
                    got = await ask(cursor)
                    if got is None or got.source != "node" or got.lines:
                        return got or first
        finally:
            waiting[0] -= 1
        return first
