"""``llmgw-control ctl <noun> <verb>``: the admin REST API from a terminal.

Talks only to the API (``--admin URL``, default the local admin listener), so whatever it can do
a script or the dashboard can do too. Tables for people by default, the API's JSON with
``--json``; an error from the API is printed as the API said it, with a non-zero exit.

About 600 lines: one small function per command over one client, plus the parser that names
them all; split by noun it would only scatter the parser.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from llmgw_shared.wire import EngineProvenance
from llmgw_shared.wire import converter as wire_converter

from .adapter_cmds import add_adapter_verbs
from .bench_cmds import add_bench, add_capacity_verbs, capacity_runs
from .client import DEFAULT_ADMIN, AdminClient, CtlError
from .mirror_cmds import add_mirror_verbs
from .tables import mib, table
from .terminal import TerminalOut

Action = Callable[[AdminClient, argparse.Namespace, TextIO], None]


def _q(segment: str) -> str:
    """A path segment: ids and names may hold characters with a meaning in URLs."""
    return quote(segment, safe="")


def _emit(out: TextIO, args: argparse.Namespace, answer: Any, human: Callable[[], str]) -> None:
    if args.json:
        out.write(json.dumps(answer, indent=2) + "\n")
    else:
        text = human()
        if text:
            out.write(text + "\n")


def _said(text: str) -> Callable[[], str]:
    return lambda: text


# --------------------------------------------------------------------------- nodes


def _engine_words(node: dict[str, Any]) -> str:
    return "; ".join(f"{e['name']} {e['version']}: {e['state']}" for e in node["engines"]) or "-"


def _gpu_words(facts: dict[str, Any]) -> str:
    """``2 (cuda)``, ``1 (vulkan)``, ``2 (cuda) DEGRADED: CPU only``, or ``-``."""
    gpus = facts.get("gpus") or []
    words = f"{len(gpus)} ({facts.get('gpu_backend') or '?'})" if gpus else ""
    if facts.get("degraded"):
        words = f"{words} DEGRADED: CPU only".strip()
    return words or "-"


def _standby_note(answer: dict[str, Any]) -> list[str]:
    """The line that says a listing is the leader's fleet as a standby reads it from the store."""
    if answer.get("role") != "standby":
        return []
    return [f"(a standby: the leader's fleet from the store; leader: {answer.get('leader') or 'unknown'})"]


def nodes_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/nodes")

    def human() -> str:
        nodes = answer["nodes"]
        if not nodes:
            return "\n".join([*_standby_note(answer), "no nodes (add one with: llmgw-control ctl nodes add NAME)"])
        rows = [[n["id"], n["state"], n["cordoned"], n["address"] or "-",
                 f"{n['facts']['cpu'] or '-'} ({n['facts']['cores']} cores)" if n["facts"]["cores"] else "-",
                 mib(n["facts"]["ram_total_mib"]) if n["facts"]["ram_total_mib"] else "-",
                 _gpu_words(n["facts"]), len(n["shards"]), _engine_words(n)] for n in nodes]
        text = table(["NODE", "STATE", "CORDONED", "ADDRESS", "CPU", "RAM", "GPUS", "REPLICAS", "ENGINES"], rows)
        warnings = [f"warning: node {n['id']}: {w}" for n in nodes for w in n["warnings"]]
        warnings += [f"warning: node {n['id']} is DEGRADED: {n['facts']['degraded']}; GPU profiles are not placed "
                     "there unless they say cpu_ok" for n in nodes if n["facts"].get("degraded")]
        return "\n".join([*_standby_note(answer), text, *warnings])

    _emit(out, args, answer, human)


def _node_action(verb: str) -> Action:
    def act(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
        answer = client.post(f"/nodes/{_q(args.node)}/{verb}")

        def human() -> str:
            node = answer["node"]
            words = {"cordon": "cordoned: no new replicas will be placed there",
                     "uncordon": "uncordoned: replicas may be placed there again",
                     "drain": "cordoned and draining"}[verb]
            text = f"node {node['id']} {words}"
            if verb == "drain":
                drained = answer["drained"]
                text += f" ({len(drained)} replica(s): {', '.join(drained)})" if drained else " (it ran no replicas)"
            return text

        _emit(out, args, answer, human)
    return act


def nodes_add(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    labels = _pairs(args.label, "--label")
    answer = client.post("/nodes", {"name": args.name, "labels": labels})

    def human() -> str:
        return "\n".join([
            f"node {answer.get('node_id', args.name)} registered.",
            "Join token (shown only this once; keep it secret):",
            f"  {answer.get('join_token', '')}",
            "Install and start the node on its machine with:",
            f"  {answer.get('install_command', '')}",
        ])

    _emit(out, args, answer, human)


def _pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    pairs = {}
    for value in values or []:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise CtlError(f"{flag} {value!r}: expected KEY=VALUE")
        pairs[key] = val
    return pairs


# --------------------------------------------------------------------------- models, replicas, engines


def models_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/models")

    def human() -> str:
        if not answer["models"]:
            return "no models (add one with: llmgw-control ctl models add --file model.toml)"
        rows = [[m["key"], m["source"], f"{m['ready']}/{len(m['replicas'])}", m["waiting_requests"],
                 mib(m["claim"]["ram_mib"]), m["status"]] for m in answer["models"]]
        return table(["MODEL", "SOURCE", "READY", "WAITING", "RAM", "STATUS"], rows)

    _emit(out, args, answer, human)


def read_model_file(path: str) -> list[dict[str, Any]]:
    """Model entries from a TOML or JSON file: one entry at the top level, or ``[[models]]``."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise CtlError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data: Any = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise CtlError(f"{path}: not valid {'JSON' if file.suffix == '.json' else 'TOML'}: {exc}") from None
    if isinstance(data, dict) and set(data) == {"models"} and isinstance(data["models"], list):
        entries = data["models"]
    else:
        entries = [data]
    if not entries or not all(isinstance(e, dict) for e in entries):
        raise CtlError(f"{path}: expected a model entry (name, profiles, ...) or [[models]] entries")
    return entries


def models_add(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    for entry in read_model_file(args.file):
        answer = client.post("/models", entry)
        _emit(out, args, answer, _said(f"model {answer['model']['name']} added"))


def models_change(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    for entry in read_model_file(args.file):
        name = entry.get("name")
        if not isinstance(name, str):
            raise CtlError(f"{args.file}: the model entry has no name")
        answer = client.put(f"/models/{_q(name)}", entry)
        _emit(out, args, answer, _said(f"model {answer['model']['name']} changed"))


def models_show(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get(f"/models/{_q(args.name)}")
    _emit(out, args, answer, lambda: json.dumps(answer, indent=2))


def models_remove(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    client.delete(f"/models/{_q(args.name)}")
    _emit(out, args, {"removed": args.name}, lambda: f"model {args.name} removed (its replicas are draining)")


def replicas_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/replicas")

    def human() -> str:
        if not answer["replicas"]:
            return "\n".join([*_standby_note(answer), "no replicas"])
        rows = [[r["id"], r["model"], r["node"] or "-", r["port"], r["routable"], r["in_flight"],
                 f"{r['status']}: {r['detail']}" if r["detail"] else r["status"]] for r in answer["replicas"]]
        return "\n".join([*_standby_note(answer),
                          table(["REPLICA", "MODEL", "NODE", "PORT", "ROUTABLE", "IN FLIGHT", "STATE"], rows)])

    _emit(out, args, answer, human)


def replicas_logs(client: AdminClient, args: argparse.Namespace, out: TextIO, *, polls: int | None = None) -> None:
    """The engine's last lines; with ``--follow``, then what it writes, until interrupted.

    Following is a long poll (``wait=true`` with the last answer's cursor): each request is held
    by control until there are new lines or its wait ends, so an idle engine costs one request per
    20 s. ``polls`` bounds the loop for tests.
    """
    path = f"/replicas/{_q(args.replica)}/logs"
    answer = client.get(path, lines=args.lines)
    _emit(out, args, answer, lambda: "\n".join(answer["lines"]))
    if answer["source"] != "node" and not args.json:
        out.write(f"(the lines node {answer['node']} sent with the failure: {answer['status']}: "
                  f"{answer['detail']})\n")
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
        rows = [[e["name"], e["version"], n["node"], n["state"], _provenance_words(n.get("provenance"))]
                for e in answer["engines"] for n in e["nodes"]]
        rows += [[e["name"], e["version"], "-", "no node connected", "-"] for e in answer["engines"] if not e["nodes"]]
        return table(["ENGINE", "VERSION", "NODE", "STATE", "PROVENANCE"], rows)

    _emit(out, args, answer, human)


def weights_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    node = getattr(args, "node", None)
    answer = client.get("/weights" + (f"?node={_q(node)}" if node else ""))

    def human() -> str:
        rows = []
        for n in answer["nodes"]:
            if not n["reported"]:
                rows.append([n["node"], "-", "-", "-", "not reported"])
            rows += [[n["node"], w["sha256"][:16], mib(w["size"] // (1 << 20)),
                      "in use" if w["in_use"] else w["last_used"], ", ".join(w["models"]) or "-"]
                     for w in n["weights"]]
        if not rows:
            return "no node holds model files"
        return table(["NODE", "SHA256", "SIZE", "LAST USED", "USED BY"], rows)

    _emit(out, args, answer, human)


# --------------------------------------------------------------------------- groups, keys, quotas, usage


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

    _emit(out, args, answer, human)


def _priority_words(group: dict[str, Any]) -> str:
    effective = str(group["effective_priority"])
    return effective if group["priority"] else f"{effective} (inherited)"


def groups_create(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    parent = resolve_group(client, args.parent) if args.parent else None
    body: dict[str, Any] = {"name": args.name, "parent_id": parent}
    if args.priority:
        body["priority"] = args.priority
    answer = client.post("/groups", body)
    _emit(out, args, answer, lambda: f"group {answer['group']['path']} created (id {answer['group']['id']})")


def groups_priority(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    group_id = resolve_group(client, args.group)
    answer = client.patch(f"/groups/{_q(group_id)}",
                          {"priority": None if args.priority == "inherit" else args.priority})
    group = answer["group"]
    _emit(out, args, answer, lambda: f"group {group['path']}: priority {_priority_words(group)}")


def groups_delete(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    group_id = resolve_group(client, args.group)
    client.delete(f"/groups/{_q(group_id)}")
    _emit(out, args, {"deleted": group_id}, lambda: f"group {args.group} deleted")


def keys_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    group = getattr(args, "group", None)
    group_id = resolve_group(client, group) if group else None
    answer = client.get("/keys", group_id=group_id)

    def human() -> str:
        if not answer["keys"]:
            return "no keys"
        paths = {g["id"]: g["path"] for g in client.get("/groups")["groups"]}
        rows = [[k["id"], k["name"], paths.get(k["group_id"], k["group_id"]), k["state"], k["admin"],
                 ",".join(k["models"]) if k["models"] is not None else "all", k["expires_at"]]
                for k in answer["keys"]]
        return table(["KEY", "NAME", "GROUP", "STATE", "ADMIN", "MODELS", "EXPIRES"], rows)

    _emit(out, args, answer, human)


def keys_create(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    body: dict[str, Any] = {"name": args.name, "group_id": resolve_group(client, args.group),
                            "admin": args.admin_key}
    if args.model:
        body["models"] = args.model
    if args.expires:
        body["expires_at"] = args.expires
    answer = client.post("/keys", body)

    def human() -> str:
        key = answer["key"]
        return "\n".join([f"key {key['id']} ({key['name']}) created.",
                          "Secret (shown only this once; it is stored as a digest):", f"  {answer['secret']}"])

    _emit(out, args, answer, human)


def keys_revoke(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.post(f"/keys/{_q(args.key)}/revoke")
    _emit(out, args, answer, lambda: f"key {args.key} revoked")


def keys_delete(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    client.delete(f"/keys/{_q(args.key)}")
    _emit(out, args, {"deleted": args.key}, lambda: f"key {args.key} deleted")


_LIMITS = (("requests_per_minute", "RPM"), ("tokens_per_minute", "TPM"), ("tokens_per_day", "TOKENS/DAY"),
           ("concurrent_requests", "CONCURRENT"))


def quotas_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/quotas")

    def human() -> str:
        if not answer["quotas"]:
            return "no quotas"
        rows = [[q["path"], *(q[name] for name, _ in _LIMITS)] for q in answer["quotas"]]
        return table(["GROUP", *(label for _, label in _LIMITS)], rows)

    _emit(out, args, answer, human)


def quotas_set(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    group_id = resolve_group(client, args.group)
    body = {name: getattr(args, name) for name, _ in _LIMITS}
    answer = client.put(f"/groups/{_q(group_id)}/quota", body)

    def human() -> str:
        quota = answer["quota"]
        limits = ", ".join(f"{name} {quota[name]}" for name, _ in _LIMITS if quota[name] is not None)
        return f"quota of {quota['path']} set: {limits or 'no limits'}"

    _emit(out, args, answer, human)


def quotas_clear(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    group_id = resolve_group(client, args.group)
    client.delete(f"/groups/{_q(group_id)}/quota")
    _emit(out, args, {"cleared": group_id}, lambda: f"quota of {args.group} cleared")


def usage_show(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    opt = vars(args)
    group_id = resolve_group(client, opt["group"]) if opt.get("group") else None
    answer = client.get("/usage", group_id=group_id, key_id=opt.get("key"), model=opt.get("model"),
                        since=opt.get("since"), until=opt.get("until"),
                        include_descendants="true" if opt.get("descendants") else None)

    def human() -> str:
        paths = {g["id"]: g["path"] for g in client.get("/groups")["groups"]} if answer["usage"] else {}
        rows = [[u["hour"], paths.get(u["group_id"], u["group_id"]) or "-", u["key_id"] or "-", u["model"],
                 u["requests"], u["prompt_tokens"], u["completion_tokens"]] for u in answer["usage"]]
        t = answer["totals"]
        rows.append(["total", "", "", "", t["requests"], t["prompt_tokens"], t["completion_tokens"]])
        return table(["HOUR", "GROUP", "KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION"], rows)

    _emit(out, args, answer, human)


def sessions_revoke(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    if (args.user is None) == (args.key is None):
        raise CtlError("name a user, or give --key ID (an admin key's dashboard sessions), not both")
    body = {"user": args.user} if args.user is not None else {"key_id": args.key}
    answer = client.post("/sessions/revoke", body)
    _emit(out, args, answer, lambda: f"dashboard sessions of {answer['subject']} issued before "
                                     f"{answer['revoked_before']} ended")


def _audit_query(args: argparse.Namespace) -> dict[str, Any]:
    opt = vars(args)
    return {"since": opt.get("since"), "until": opt.get("until"), "actor": opt.get("actor"),
            "resource": opt.get("resource"), "resource_id": opt.get("id"), "outcome": opt.get("outcome")}


def audit_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/audit", limit=args.limit, cursor=args.cursor, **_audit_query(args))

    def human() -> str:
        rows = [[e["at"], e["actor"], e["peer"] or "-", e["outcome"], e["action"],
                 f"{e['resource']} {e['resource_id']}".strip()] for e in answer["entries"]]
        more = f"\n(more: --cursor {answer['next_cursor']})" if answer.get("next_cursor") else ""
        return table(["AT", "ACTOR", "FROM", "OUTCOME", "ACTION", "WHAT"], rows) + more

    _emit(out, args, answer, human)


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


# --------------------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--admin", default=argparse.SUPPRESS,
                        help=f"the admin API's base URL (default {DEFAULT_ADMIN})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print the API's JSON instead of a table")
    parser = argparse.ArgumentParser(prog="llmgw-control ctl", parents=[common],
                                     description="Manage llmgw through its admin REST API.")
    nouns = parser.add_subparsers(dest="noun", required=True, metavar="NOUN")

    def noun(name: str, help: str, default: Action | None) -> Any:
        p = nouns.add_parser(name, help=help, parents=[common])
        verbs = p.add_subparsers(dest="verb", metavar="VERB", required=default is None)
        if default is not None:
            p.set_defaults(action=default)
        return verbs

    def verb(verbs: Any, name: str, action: Action, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = verbs.add_parser(name, help=help, parents=[common])
        p.set_defaults(action=action)
        return p

    v = noun("nodes", "nodes: list (default), add, cordon, drain, uncordon", nodes_list)
    verb(v, "list", nodes_list, "every node with its engine state and warnings")
    p = verb(v, "add", nodes_add, "register a node: prints its join token (once) and the install command")
    p.add_argument("name")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="a node label (repeatable)")
    for name, words in (("cordon", "place no new replicas on the node"),
                        ("drain", "cordon the node and drain its replicas"),
                        ("uncordon", "allow new replicas on the node again")):
        verb(v, name, _node_action(name), words).add_argument("node")

    v = noun("models", "models: list (default), show, add, change, remove, adapters, search, files, pull, pulls, "
             "publish",
             models_list)
    verb(v, "list", models_list, "every model profile with its replicas and status")
    verb(v, "show", models_show, "a model's definition").add_argument("name")
    verb(v, "add", models_add, "add the model(s) in a TOML or JSON file").add_argument("--file", required=True)
    verb(v, "change", models_change, "replace a model with the definition in a file").add_argument(
        "--file", required=True)
    verb(v, "remove", models_remove, "remove a model (its replicas are drained)").add_argument("name")
    add_mirror_verbs(v, verb)
    add_adapter_verbs(v, verb, common)

    v = noun("replicas", "replicas: list (default), logs", replicas_list)
    verb(v, "list", replicas_list, "every replica the control daemon manages")
    p = verb(v, "logs", replicas_logs, "the engine's last output lines (--follow: then what it writes)")
    p.add_argument("replica")
    p.add_argument("--lines", "-n", type=int, default=100, help="how many of the last lines (1-1000, default 100)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until interrupted")
    v = noun("engines", "engines: list (default)", engines_list)
    verb(v, "list", engines_list, "the engines and their state on each node")
    weights = nouns.add_parser("weights", help="weights: list (default) [--node N]", parents=[common])
    weights.add_argument("--node", default=argparse.SUPPRESS, help="only this node")
    weights.set_defaults(action=weights_list)
    v = weights.add_subparsers(dest="verb", metavar="VERB", required=False)
    verb(v, "list", weights_list, "the model files each node holds, their size and when last used").add_argument(
        "--node", default=argparse.SUPPRESS, help="only this node")

    add_bench(nouns, common)
    v = noun("capacity", "capacity: runs (default)", capacity_runs)
    add_capacity_verbs(v, verb)

    v = noun("groups", "groups: list (default), create, priority, delete", groups_list)
    verb(v, "list", groups_list, "the group tree")
    p = verb(v, "create", groups_create, "create a group")
    p.add_argument("name")
    p.add_argument("--parent", help="the parent group (id or path, e.g. org/team)")
    p.add_argument("--priority", choices=("interactive", "batch"),
                   help="how its requests wait for a replica slot (default: the parent's)")
    p = verb(v, "priority", groups_priority, "set how a group's requests wait for a replica slot")
    p.add_argument("group", help="id or path")
    p.add_argument("priority", choices=("interactive", "batch", "inherit"),
                   help="interactive goes first; batch gets a bounded share; inherit: the parent's")
    verb(v, "delete", groups_delete, "delete a group (id or path)").add_argument("group")

    v = noun("keys", "keys: list (default), create, revoke, delete", keys_list)
    for target in (verb(v, "list", keys_list, "API keys (never their secrets)"), nouns.choices["keys"]):
        # SUPPRESS: a verb's unset option must not overwrite the noun's (argparse would).
        target.add_argument("--group", default=argparse.SUPPRESS, help="only this group's keys (id or path)")
    p = verb(v, "create", keys_create, "create a key: prints its secret, this once")
    p.add_argument("name")
    p.add_argument("--group", required=True, help="the key's group (id or path)")
    p.add_argument("--model", action="append", help="a model the key may use (repeatable; default: all)")
    # Not --admin: that is the API's URL on every command.
    p.add_argument("--admin-key", action="store_true", help="an admin key: it may open the dashboard")
    p.add_argument("--expires", help="expiry, RFC 3339 (e.g. 2027-01-01T00:00:00Z)")
    verb(v, "revoke", keys_revoke, "revoke a key").add_argument("key")
    verb(v, "delete", keys_delete, "delete a key").add_argument("key")

    v = noun("quotas", "quotas: list (default), set, clear", quotas_list)
    verb(v, "list", quotas_list, "every group's quota")
    p = verb(v, "set", quotas_set, "set (replace) a group's quota; limits not given are unlimited")
    p.add_argument("group", help="id or path")
    for name, label in _LIMITS:
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, metavar="N", help=f"{label} (0 pauses)")
    verb(v, "clear", quotas_clear, "remove a group's quota").add_argument("group", help="id or path")

    v = noun("sessions", "sessions: revoke (end a dashboard user's sessions on every daemon)", None)
    p = verb(v, "revoke", sessions_revoke, "end a signed-in user's dashboard sessions (they may sign in again)")
    p.add_argument("user", nargs="?", default=None, help="the user as the dashboard names them (e.g. an email)")
    p.add_argument("--key", default=None, metavar="ID", help="instead: an admin key's dashboard sessions")

    v = noun("audit", "audit: list (default), export (JSON lines, for a SIEM)", audit_list)
    for target, limit in ((verb(v, "list", audit_list, "the newest audit rows"), True),
                          (verb(v, "export", audit_export, "every matching row as JSON lines"), False),
                          (nouns.choices["audit"], True)):
        target.add_argument("--since", help="from this time on (ISO 8601)")
        target.add_argument("--until", help="before this time (ISO 8601)")
        target.add_argument("--actor", help="key:<id>, user:<name>, loopback or daemon:<id>")
        target.add_argument("--resource", help="key, group, quota, model, node, pull, capacity_run, leadership...")
        target.add_argument("--id", help="the resource's id")
        target.add_argument("--outcome", choices=("ok", "refused"))
        if limit:
            target.add_argument("--limit", type=int, default=50, help="rows (1-500, default 50)")
            target.add_argument("--cursor", default=None, help="the next page, as a previous list printed it")

    v = noun("usage", "usage: show (default) with filters", usage_show)
    for target in (v.add_parser("show", help="hourly usage and totals", parents=[common]),
                   nouns.choices["usage"]):
        target.set_defaults(action=usage_show)
        hidden = argparse.SUPPRESS
        target.add_argument("--group", default=hidden, help="id or path")
        target.add_argument("--descendants", action="store_true", default=hidden,
                            help="with --group: include its descendants")
        target.add_argument("--key", default=hidden, help="a key id")
        target.add_argument("--model", default=hidden)
        target.add_argument("--since", default=hidden, help="RFC 3339, e.g. 2026-12-01T00:00:00Z")
        target.add_argument("--until", default=hidden, help="RFC 3339, exclusive")
    return parser


def main(argv: list[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    # Everything a command writes passes here, escaped for the terminal (ctl/terminal.py).
    out = TerminalOut(stdout or sys.stdout)
    err = TerminalOut(stderr or sys.stderr)
    args = build_parser().parse_args(argv)
    args.admin = getattr(args, "admin", DEFAULT_ADMIN)
    args.json = getattr(args, "json", False)
    try:
        with AdminClient(args.admin) as client:
            args.action(client, args, out)
    except CtlError as exc:
        err.write(f"error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130  # Ctrl-C ends a --follow: the shell's code for SIGINT, without a traceback
    return 0
