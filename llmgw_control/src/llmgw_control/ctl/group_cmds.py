"""``ctl groups list|create|priority|delete`` and ``ctl quotas list|set|clear``: the group tree and its limits.

``resolve_group`` lets every command take a group's id or its path (``org/team``).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from .client import AdminClient, CtlError
from .common import Nouns, emit, q
from .tables import table


def resolve_group(client: AdminClient, text: str) -> str:
    """A group id from an id or a path (``org/team``), so people need not copy ids around."""
    groups = client.get("/groups")["groups"]
    for group in groups:
        if group["id"] == text:
            return str(group["id"])
    matches = [g for g in groups if g["path"] == text]
    if len(matches) == 1:
        return str(matches[0]["id"])
    raise CtlError(f"no group with the id or path {text!r} (see: llmgw-control ctl groups)")


def groups_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/groups")

    def human() -> str:
        if not answer["groups"]:
            return "no groups"
        rows = [[g["path"], g["id"], _priority_words(g)] for g in sorted(answer["groups"], key=lambda g: g["path"])]
        return table(["GROUP", "ID", "PRIORITY"], rows)

    emit(out, args, answer, human)


def _priority_words(group: dict[str, Any]) -> str:
    effective = str(group["effective_priority"])
    return effective if group["priority"] else f"{effective} (inherited)"


def groups_create(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    parent = resolve_group(client, args.parent) if args.parent else None
    body: dict[str, Any] = {"name": args.name, "parent_id": parent}
    if args.priority:
        body["priority"] = args.priority
    answer = client.post("/groups", body)
    emit(out, args, answer, lambda: f"group {answer['group']['path']} created (id {answer['group']['id']})")


def groups_priority(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    group_id = resolve_group(client, args.group)
    answer = client.patch(f"/groups/{q(group_id)}", {"priority": None if args.priority == "inherit" else args.priority})
    group = answer["group"]
    emit(out, args, answer, lambda: f"group {group['path']}: priority {_priority_words(group)}")


def groups_delete(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    group_id = resolve_group(client, args.group)
    client.delete(f"/groups/{q(group_id)}")
    emit(out, args, {"deleted": group_id}, lambda: f"group {args.group} deleted")


_LIMITS = (
    ("requests_per_minute", "RPM"),
    ("tokens_per_minute", "TPM"),
    ("tokens_per_day", "TOKENS/DAY"),
    ("concurrent_requests", "CONCURRENT"),
)


def quotas_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/quotas")

    def human() -> str:
        if not answer["quotas"]:
            return "no quotas"
        rows = [[q["path"], *(q[name] for name, _ in _LIMITS)] for q in answer["quotas"]]
        return table(["GROUP", *(label for _, label in _LIMITS)], rows)

    emit(out, args, answer, human)


def quotas_set(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    group_id = resolve_group(client, args.group)
    body = {name: getattr(args, name) for name, _ in _LIMITS}
    answer = client.put(f"/groups/{q(group_id)}/quota", body)

    def human() -> str:
        quota = answer["quota"]
        limits = ", ".join(f"{name} {quota[name]}" for name, _ in _LIMITS if quota[name] is not None)
        return f"quota of {quota['path']} set: {limits or 'no limits'}"

    emit(out, args, answer, human)


def quotas_clear(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    group_id = resolve_group(client, args.group)
    client.delete(f"/groups/{q(group_id)}/quota")
    emit(out, args, {"cleared": group_id}, lambda: f"quota of {args.group} cleared")


def add_groups(nouns: Nouns) -> None:
    v = nouns.noun("groups", "groups: list (default), create, priority, delete", groups_list)
    nouns.verb(v, "list", groups_list, "the group tree")
    p = nouns.verb(v, "create", groups_create, "create a group")
    p.add_argument("name")
    p.add_argument("--parent", help="the parent group (id or path, e.g. org/team)")
    p.add_argument(
        "--priority",
        choices=("interactive", "batch"),
        help="how its requests wait for a replica slot (default: the parent's)",
    )
    p = nouns.verb(v, "priority", groups_priority, "set how a group's requests wait for a replica slot")
    p.add_argument("group", help="id or path")
    p.add_argument(
        "priority",
        choices=("interactive", "batch", "inherit"),
        help="interactive goes first; batch gets a bounded share; inherit: the parent's",
    )
    nouns.verb(v, "delete", groups_delete, "delete a group (id or path)").add_argument("group")


def add_quotas(nouns: Nouns) -> None:
    v = nouns.noun("quotas", "quotas: list (default), set, clear", quotas_list)
    nouns.verb(v, "list", quotas_list, "every group's quota")
    p = nouns.verb(v, "set", quotas_set, "set (replace) a group's quota; limits not given are unlimited")
    p.add_argument("group", help="id or path")
    for name, label in _LIMITS:
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, metavar="N", help=f"{label} (0 pauses)")
    nouns.verb(v, "clear", quotas_clear, "remove a group's quota").add_argument("group", help="id or path")
