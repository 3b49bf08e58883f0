"""``ctl audit list|export``: who changed what, and what was refused, from the audit log."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from .client import AdminClient
from .common import Nouns, emit
from .tables import table


def _audit_query(args: argparse.Namespace) -> dict[str, Any]:
    opt = vars(args)
    return {
        "since": opt.get("since"),
        "until": opt.get("until"),
        "actor": opt.get("actor"),
        "resource": opt.get("resource"),
        "resource_id": opt.get("id"),
        "outcome": opt.get("outcome"),
    }


def audit_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/audit", limit=args.limit, cursor=args.cursor, **_audit_query(args))

    def human() -> str:
        rows = [
            [
                e["at"],
                e["actor"],
                e["peer"] or "-",
                e["outcome"],
                e["action"],
                f"{e['resource']} {e['resource_id']}".strip(),
            ]
            for e in answer["entries"]
        ]
        more = f"\n(more: --cursor {answer['next_cursor']})" if answer.get("next_cursor") else ""
        return table(["AT", "ACTOR", "FROM", "OUTCOME", "ACTION", "WHAT"], rows) + more

    emit(out, args, answer, human)


def audit_export(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    """Every matching row, one JSON object a line (for a SIEM), following the pages to the end."""
    cursor = None
    while True:
        answer = client.get("/audit", limit=500, cursor=cursor, **_audit_query(args))
        for entry in answer["entries"]:
            out.write(json.dumps(entry, sort_keys=True) + "\n")
        cursor = answer.get("next_cursor")
        if not cursor:
            return


def add_audit(nouns: Nouns) -> None:
    v = nouns.noun("audit", "audit: list (default), export (JSON lines, for a SIEM)", audit_list)
    for target, limit in (
        (nouns.verb(v, "list", audit_list, "the newest audit rows"), True),
        (nouns.verb(v, "export", audit_export, "every matching row as JSON lines"), False),
        (nouns.parser("audit"), True),
    ):
        target.add_argument("--since", help="from this time on (ISO 8601)")
        target.add_argument("--until", help="before this time (ISO 8601)")
        target.add_argument("--actor", help="key:<id>, user:<name>, loopback or daemon:<id>")
        target.add_argument("--resource", help="key, group, quota, model, node, pull, capacity_run, leadership...")
        target.add_argument("--id", help="the resource's id")
        target.add_argument("--outcome", choices=("ok", "refused"))
        if limit:
            target.add_argument("--limit", type=int, default=50, help="rows (1-500, default 50)")
            target.add_argument("--cursor", default=None, help="the next page, as a previous list printed it")
