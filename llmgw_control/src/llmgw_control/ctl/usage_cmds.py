"""``ctl usage show``: hourly usage and totals, by group, key and model."""

from __future__ import annotations

import argparse
from typing import TextIO

from .client import AdminClient
from .common import Nouns, emit
from .group_cmds import resolve_group
from .tables import table


def usage_show(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    opt = vars(args)
    group_id = resolve_group(client, opt["group"]) if opt.get("group") else None
    answer = client.get(
        "/usage",
        group_id=group_id,
        key_id=opt.get("key"),
        model=opt.get("model"),
        since=opt.get("since"),
        until=opt.get("until"),
        include_descendants="true" if opt.get("descendants") else None,
    )

    def human() -> str:
        paths = {g["id"]: g["path"] for g in client.get("/groups")["groups"]} if answer["usage"] else {}
        rows = [
            [
                u["hour"],
                paths.get(u["group_id"], u["group_id"]) or "-",
                u["key_id"] or "-",
                u["model"],
                u["requests"],
                u["prompt_tokens"],
                u["completion_tokens"],
            ]
            for u in answer["usage"]
        ]
        t = answer["totals"]
        rows.append(["total", "", "", "", t["requests"], t["prompt_tokens"], t["completion_tokens"]])
        return table(["HOUR", "GROUP", "KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION"], rows)

    emit(out, args, answer, human)


def add_usage(nouns: Nouns) -> None:
    v = nouns.noun("usage", "usage: show (default) with filters", usage_show)
    for target in (v.add_parser("show", help="hourly usage and totals", parents=[nouns.common]), nouns.parser("usage")):
        target.set_defaults(action=usage_show)
        hidden = argparse.SUPPRESS
        target.add_argument("--group", default=hidden, help="id or path")
        target.add_argument(
            "--descendants", action="store_true", default=hidden, help="with --group: include its descendants"
        )
        target.add_argument("--key", default=hidden, help="a key id")
        target.add_argument("--model", default=hidden)
        target.add_argument("--since", default=hidden, help="RFC 3339, e.g. 2026-12-01T00:00:00Z")
        target.add_argument("--until", default=hidden, help="RFC 3339, exclusive")
