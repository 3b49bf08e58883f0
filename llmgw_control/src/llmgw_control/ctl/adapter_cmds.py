"""``ctl models adapters add|remove``: a profile's LoRA adapters from a terminal.

Each is a read-modify-write of the model's definition through the admin API (GET, then PUT
``/models/{name}``), so the server validates the result as any changed model and decides what
restarts: llama.cpp replicas are replaced (llama-server loads adapters only at start), vLLM's keep
running.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import quote

from .client import AdminClient, CtlError

Action = Callable[[AdminClient, argparse.Namespace, TextIO], None]
Verb = Callable[[Any, str, Action, str], argparse.ArgumentParser]


def _profile(definition: dict[str, Any], name: str) -> dict[str, Any]:
    profiles = definition.get("profiles") or []
    if not name:
        if len(profiles) != 1:
            raise CtlError("the model has several profiles: name one with --profile")
        chosen: dict[str, Any] = profiles[0]
        return chosen
    for profile in profiles:
        if profile.get("name") == name:
            found: dict[str, Any] = profile
            return found
    raise CtlError(f"the model has no profile {name!r}")


def _change(client: AdminClient, args: argparse.Namespace, out: TextIO,
            edit: Callable[[list[dict[str, Any]]], str]) -> None:
    path = f"/models/{quote(args.model, safe='')}"
    definition: dict[str, Any] = client.get(path)["model"]
    profile = _profile(definition, args.profile)
    adapters: list[dict[str, Any]] = profile.setdefault("adapters", [])
    said = edit(adapters)
    answer = client.put(path, definition)
    if getattr(args, "json", False):
        out.write(json.dumps(answer) + "\n")
    else:
        out.write(said + "\n")


def adapters_add(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    def edit(adapters: list[dict[str, Any]]) -> str:
        adapters.append({"name": args.name, "weights": {"url": args.url, "sha256": args.sha256, "size": args.size},
                         "scale": args.scale})
        return (f"adapter {args.name} added to {args.model}: a model name of its own (llama.cpp replicas "
                "restart to load it; vLLM loads it live)")

    _change(client, args, out, edit)


def adapters_remove(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    def edit(adapters: list[dict[str, Any]]) -> str:
        kept = [a for a in adapters if a.get("name") != args.name]
        if len(kept) == len(adapters):
            raise CtlError(f"the profile has no adapter {args.name!r}")
        adapters[:] = kept
        return f"adapter {args.name} removed from {args.model}"

    _change(client, args, out, edit)


def add_adapter_verbs(models: Any, verb: Verb, common: argparse.ArgumentParser) -> None:
    """``models adapters add|remove`` under the ``models`` noun's verbs."""
    noun = models.add_parser("adapters", help="a profile's LoRA adapters: add, remove", parents=[common])
    verbs = noun.add_subparsers(dest="adapter_verb", metavar="VERB", required=True)
    p = verb(verbs, "add", adapters_add, "add a LoRA adapter (its own model name) to a model's profile")
    p.add_argument("model")
    p.add_argument("name", help="the adapter's model name")
    p.add_argument("--url", required=True, help="the GGUF adapter file: an http(s) URL or a path on the nodes")
    p.add_argument("--sha256", required=True)
    p.add_argument("--size", type=int, required=True, help="the file's size in bytes")
    p.add_argument("--scale", type=float, default=1.0, help="its scale when applied (default 1.0)")
    p.add_argument("--profile", default="", help="the profile (needed when the model has several)")
    p = verb(verbs, "remove", adapters_remove, "remove an adapter from a model's profile")
    p.add_argument("model")
    p.add_argument("name")
    p.add_argument("--profile", default="", help="the profile (needed when the model has several)")
