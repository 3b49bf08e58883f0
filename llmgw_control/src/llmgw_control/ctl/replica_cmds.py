"""``ctl replicas list|logs``, ``ctl engines`` and ``ctl weights``: what runs on the nodes and what they hold."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from llmgw_shared.wire import EngineProvenance
from llmgw_shared.wire import converter as wire_converter

from .client import AdminClient
from .common import Nouns, emit, q, standby_note
from .tables import mib, table


def replicas_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/replicas")

    def human() -> str:
        if not answer["replicas"]:
            return "\n".join([*standby_note(answer), "no replicas"])
        rows = [
            [
                r["id"],
                r["model"],
                r["node"] or "-",
                r["port"],
                r["routable"],
                r["in_flight"],
                f"{r['status']}: {r['detail']}" if r["detail"] else r["status"],
            ]
            for r in answer["replicas"]
        ]
        return "\n".join(
            [*standby_note(answer), table(["REPLICA", "MODEL", "NODE", "PORT", "ROUTABLE", "IN FLIGHT", "STATE"], rows)]
        )

    emit(out, args, answer, human)


def replicas_logs(client: AdminClient, args: argparse.Namespace, out: TextIO, *, polls: int | None = None) -> None:
    """The engine's last lines; with ``--follow``, then what it writes, until interrupted.

    Following is a long poll (``wait=true`` with the last answer's cursor): each request is held
    by control until there are new lines or its wait ends, so an idle engine costs one request per
    20 s. ``polls`` bounds the loop for tests.
    """
    path = f"/replicas/{q(args.replica)}/logs"
    answer = client.get(path, lines=args.lines)
    emit(out, args, answer, lambda: "\n".join(answer["lines"]))
    if answer["source"] != "node" and not args.json:
        out.write(f"(the lines node {answer['node']} sent with the failure: {answer['status']}: {answer['detail']})\n")
    done = 0
    while args.follow and answer["cursor"] and (polls is None or done < polls):
        done += 1
        answer = client.get(path, lines=1000, cursor=answer["cursor"], wait="true")
        for line in answer["lines"]:
            out.write((json.dumps(line) if args.json else line) + "\n")
        out.flush()
    if args.follow and not answer["cursor"] and polls is None:
        out.write(f"(not following: node {answer['node']} cannot be asked for more)\n")


def _provenance_words(raw: Any) -> str:
    """The node's record of where its install came from, in the node's own words (``-``: none)."""
    if raw is None:
        return "-"
    try:
        return wire_converter.structure(raw, EngineProvenance).describe()
    except Exception:  # an answer from a newer control: show it rather than fail the listing
        return str(raw)


def engines_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/engines")

    def human() -> str:
        rows = [
            [e["name"], e["version"], n["node"], n["state"], _provenance_words(n.get("provenance"))]
            for e in answer["engines"]
            for n in e["nodes"]
        ]
        rows += [[e["name"], e["version"], "-", "no node connected", "-"] for e in answer["engines"] if not e["nodes"]]
        return table(["ENGINE", "VERSION", "NODE", "STATE", "PROVENANCE"], rows)

    emit(out, args, answer, human)


def weights_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    node = getattr(args, "node", None)
    answer = client.get("/weights" + (f"?node={q(node)}" if node else ""))

    def human() -> str:
        rows = []
        for n in answer["nodes"]:
            if not n["reported"]:
                rows.append([n["node"], "-", "-", "-", "not reported"])
            rows += [
                [
                    n["node"],
                    w["sha256"][:16],
                    mib(w["size"] // (1 << 20)),
                    "in use" if w["in_use"] else w["last_used"],
                    ", ".join(w["models"]) or "-",
                ]
                for w in n["weights"]
            ]
        if not rows:
            return "no node holds model files"
        return table(["NODE", "SHA256", "SIZE", "LAST USED", "USED BY"], rows)

    emit(out, args, answer, human)


def add_replicas(nouns: Nouns) -> None:
    v = nouns.noun("replicas", "replicas: list (default), logs", replicas_list)
    nouns.verb(v, "list", replicas_list, "every replica the control daemon manages")
    p = nouns.verb(v, "logs", replicas_logs, "the engine's last output lines (--follow: then what it writes)")
    p.add_argument("replica")
    p.add_argument("--lines", "-n", type=int, default=100, help="how many of the last lines (1-1000, default 100)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until interrupted")


def add_engines(nouns: Nouns) -> None:
    v = nouns.noun("engines", "engines: list (default)", engines_list)
    nouns.verb(v, "list", engines_list, "the engines and their state on each node")


def add_weights(nouns: Nouns) -> None:
    # Not nouns.noun: the noun alone takes --node too.
    weights = nouns.subparsers.add_parser("weights", help="weights: list (default) [--node N]", parents=[nouns.common])
    weights.add_argument("--node", default=argparse.SUPPRESS, help="only this node")
    weights.set_defaults(action=weights_list)
    v = weights.add_subparsers(dest="verb", metavar="VERB", required=False)
    nouns.verb(v, "list", weights_list, "the model files each node holds, their size and when last used").add_argument(
        "--node", default=argparse.SUPPRESS, help="only this node"
    )
