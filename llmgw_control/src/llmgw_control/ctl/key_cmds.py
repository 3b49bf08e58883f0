"""``ctl keys list|create|revoke|delete`` and ``ctl sessions revoke``: API keys, and dashboard sessions.

A session is opened with an admin key or by a signed-in user; ``sessions revoke`` ends either's.
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from .client import AdminClient, CtlError
from .common import Nouns, emit, q
from .group_cmds import resolve_group
from .tables import table


def keys_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    group = getattr(args, "group", None)
    group_id = resolve_group(client, group) if group else None
    answer = client.get("/keys", group_id=group_id)

    def human() -> str:
        if not answer["keys"]:
            return "no keys"
        paths = {g["id"]: g["path"] for g in client.get("/groups")["groups"]}
        rows = [
            [
                k["id"],
                k["name"],
                paths.get(k["group_id"], k["group_id"]),
                k["state"],
                k["admin"],
                ",".join(k["models"]) if k["models"] is not None else "all",
                k["expires_at"],
            ]
            for k in answer["keys"]
        ]
        return table(["KEY", "NAME", "GROUP", "STATE", "ADMIN", "MODELS", "EXPIRES"], rows)

    emit(out, args, answer, human)


def keys_create(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    body: dict[str, Any] = {"name": args.name, "group_id": resolve_group(client, args.group), "admin": args.admin_key}
    if args.model:
        body["models"] = args.model
    if args.expires:
        body["expires_at"] = args.expires
    answer = client.post("/keys", body)

    def human() -> str:
        key = answer["key"]
        return "\n".join(
            [
                f"key {key['id']} ({key['name']}) created.",
                "Secret (shown only this once; it is stored as a digest):",
                f"  {answer['secret']}",
            ]
        )

    emit(out, args, answer, human)


def keys_revoke(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.post(f"/keys/{q(args.key)}/revoke")
    emit(out, args, answer, lambda: f"key {args.key} revoked")


def keys_delete(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    client.delete(f"/keys/{q(args.key)}")
    emit(out, args, {"deleted": args.key}, lambda: f"key {args.key} deleted")


def sessions_revoke(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    if (args.user is None) == (args.key is None):
        raise CtlError("name a user, or give --key ID (an admin key's dashboard sessions), not both")
    body = {"user": args.user} if args.user is not None else {"key_id": args.key}
    answer = client.post("/sessions/revoke", body)
    emit(
        out,
        args,
        answer,
        lambda: f"dashboard sessions of {answer['subject']} issued before {answer['revoked_before']} ended",
    )


def add_keys(nouns: Nouns) -> None:
    v = nouns.noun("keys", "keys: list (default), create, revoke, delete", keys_list)
    for target in (nouns.verb(v, "list", keys_list, "API keys (never their secrets)"), nouns.parser("keys")):
        # SUPPRESS: a verb's unset option must not overwrite the noun's (argparse would).
        target.add_argument("--group", default=argparse.SUPPRESS, help="only this group's keys (id or path)")
    p = nouns.verb(v, "create", keys_create, "create a key: prints its secret, this once")
    p.add_argument("name")
    p.add_argument("--group", required=True, help="the key's group (id or path)")
    p.add_argument("--model", action="append", help="a model the key may use (repeatable; default: all)")
    # Not --admin: that is the API's URL on every command.
    p.add_argument("--admin-key", action="store_true", help="an admin key: it may open the dashboard")
    p.add_argument("--expires", help="expiry, RFC 3339 (e.g. 2027-01-01T00:00:00Z)")
    nouns.verb(v, "revoke", keys_revoke, "revoke a key").add_argument("key")
    nouns.verb(v, "delete", keys_delete, "delete a key").add_argument("key")


def add_sessions(nouns: Nouns) -> None:
    v = nouns.noun("sessions", "sessions: revoke (end a dashboard user's sessions on every daemon)", None)
    p = nouns.verb(v, "revoke", sessions_revoke, "end a signed-in user's dashboard sessions (they may sign in again)")
    p.add_argument("user", nargs="?", default=None, help="the user as the dashboard names them (e.g. an email)")
    p.add_argument("--key", default=None, metavar="ID", help="instead: an admin key's dashboard sessions")
