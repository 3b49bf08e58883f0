"""``ctl nodes list|add|cordon|drain|uncordon``: the fleet's nodes from a terminal."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from .client import AdminClient, CtlError
from .common import Action, Nouns, emit, q, standby_note
from .tables import mib, table


def _engine_words(node: dict[str, Any]) -> str:
    return "; ".join(f"{e['name']} {e['version']}: {e['state']}" for e in node["engines"]) or "-"


def _gpu_words(facts: dict[str, Any]) -> str:
    """``2 (cuda)``, ``1 (vulkan)``, ``2 (cuda) DEGRADED: CPU only``, or ``-``."""
    gpus = facts.get("gpus") or []
    words = f"{len(gpus)} ({facts.get('gpu_backend') or '?'})" if gpus else ""
    if facts.get("degraded"):
        words = f"{words} DEGRADED: CPU only".strip()
    return words or "-"


def nodes_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/nodes")

    def human() -> str:
        nodes = answer["nodes"]
        if not nodes:
            return "\n".join([*standby_note(answer), "no nodes (add one with: llmgw-control ctl nodes add NAME)"])
        rows = [
            [
                n["id"],
                n["state"],
                n["cordoned"],
                n["address"] or "-",
                f"{n['facts']['cpu'] or '-'} ({n['facts']['cores']} cores)" if n["facts"]["cores"] else "-",
                mib(n["facts"]["ram_total_mib"]) if n["facts"]["ram_total_mib"] else "-",
                _gpu_words(n["facts"]),
                len(n["shards"]),
                _engine_words(n),
            ]
            for n in nodes
        ]
        text = table(["NODE", "STATE", "CORDONED", "ADDRESS", "CPU", "RAM", "GPUS", "REPLICAS", "ENGINES"], rows)
        warnings = [f"warning: node {n['id']}: {w}" for n in nodes for w in n["warnings"]]
        warnings += [
            f"warning: node {n['id']} is DEGRADED: {n['facts']['degraded']}; GPU profiles are not placed "
            "there unless they say cpu_ok"
            for n in nodes
            if n["facts"].get("degraded")
        ]
        return "\n".join([*standby_note(answer), text, *warnings])

    emit(out, args, answer, human)


def _node_action(verb: str) -> Action:
    def act(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
        answer = client.post(f"/nodes/{q(args.node)}/{verb}")

        def human() -> str:
            node = answer["node"]
            words = {
                "cordon": "cordoned: no new replicas will be placed there",
                "uncordon": "uncordoned: replicas may be placed there again",
                "drain": "cordoned and draining",
            }[verb]
            text = f"node {node['id']} {words}"
            if verb == "drain":
                drained = answer["drained"]
                text += f" ({len(drained)} replica(s): {', '.join(drained)})" if drained else " (it ran no replicas)"
            return text

        emit(out, args, answer, human)

    return act


def nodes_add(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    labels = _pairs(args.label, "--label")
    answer = client.post("/nodes", {"name": args.name, "labels": labels})

    def human() -> str:
        return "\n".join(
            [
                f"node {answer.get('node_id', args.name)} registered.",
                "Join token (shown only this once; keep it secret):",
                f"  {answer.get('join_token', '')}",
                "Install and start the node on its machine with:",
                f"  {answer.get('install_command', '')}",
            ]
        )

    emit(out, args, answer, human)


def _pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    pairs = {}
    for value in values or []:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise CtlError(f"{flag} {value!r}: expected KEY=VALUE")
        pairs[key] = val
    return pairs


def add_nodes(nouns: Nouns) -> None:
    v = nouns.noun("nodes", "nodes: list (default), add, cordon, drain, uncordon", nodes_list)
    nouns.verb(v, "list", nodes_list, "every node with its engine state and warnings")
    p = nouns.verb(v, "add", nodes_add, "register a node: prints its join token (once) and the install command")
    p.add_argument("name")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="a node label (repeatable)")
    for name, words in (
        ("cordon", "place no new replicas on the node"),
        ("drain", "cordon the node and drain its replicas"),
        ("uncordon", "allow new replicas on the node again"),
    ):
        nouns.verb(v, name, _node_action(name), words).add_argument("node")
