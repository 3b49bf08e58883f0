"""``ctl models adapters list|add|remove|scale``: a profile's LoRA adapters from a terminal.

Each verb is one call to the admin API's adapter routes
(``/models/{name}/profiles/{profile}/adapters``, admin/api/adapter_routes.py), which validate the
change, store it as a model change and decide what restarts: llama.cpp replicas are replaced
(llama-server loads adapters only at start), vLLM's keep running and load or unload it live. A
model with one profile needs no ``--profile`` (its definition is read to find it).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import quote

from .client import AdminClient, CtlError
from .tables import table

Action = Callable[[AdminClient, argparse.Namespace, TextIO], None]
Verb = Callable[[Any, str, Action, str], argparse.ArgumentParser]


def _base(client: AdminClient, args: argparse.Namespace) -> str:
    """The profile's adapters path; the model's only profile when none is named."""
    profile = args.profile
    if not profile:
        definition: dict[str, Any] = client.get(f"/models/{quote(args.model, safe='')}")["model"]
        profiles = definition.get("profiles") or []
        if len(profiles) != 1:
            raise CtlError("the model has several profiles: name one with --profile")
        profile = str(profiles[0].get("name", ""))
    return f"/models/{quote(args.model, safe='')}/profiles/{quote(profile, safe='')}/adapters"


def _say(args: argparse.Namespace, out: TextIO, answer: Any, words: str) -> None:
    out.write((json.dumps(answer) if getattr(args, "json", False) else words) + "\n")


def adapters_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get(_base(client, args))
    rows = [[a["name"], a["size"], a["scale"], ", ".join(a["loaded_on"]) or "-", a["url"]] for a in answer["adapters"]]
    _say(args, out, answer, table(["ADAPTER", "BYTES", "SCALE", "LOADED ON", "URL"], rows))


def adapters_add(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    body = {"name": args.name, "url": args.url, "sha256": args.sha256, "size": args.size, "scale": args.scale}
    answer = client.post(_base(client, args), body)
    _say(
        args,
        out,
        answer,
        f"adapter {args.name} added to {args.model}: a model name of its own (llama.cpp "
        "replicas restart to load it; vLLM loads it live)",
    )


def adapters_remove(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    client.delete(f"{_base(client, args)}/{quote(args.name, safe='')}")
    _say(args, out, {}, f"adapter {args.name} removed from {args.model}")


def adapters_scale(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.patch(f"{_base(client, args)}/{quote(args.name, safe='')}", {"scale": args.scale})
    _say(args, out, answer, f"adapter {args.name} of {args.model} now applies at scale {args.scale:g}")


def add_adapter_verbs(models: Any, verb: Verb, common: argparse.ArgumentParser) -> None:
    """``models adapters list|add|remove|scale`` under the ``models`` noun's verbs."""
    noun = models.add_parser("adapters", help="a profile's LoRA adapters: list, add, remove, scale", parents=[common])
    verbs = noun.add_subparsers(dest="adapter_verb", metavar="VERB", required=True)

    def target(p: argparse.ArgumentParser, name: bool = True) -> None:
        p.add_argument("model")
        if name:
            p.add_argument("name", help="the adapter's model name")
        p.add_argument("--profile", default="", help="the profile (needed when the model has several)")

    target(verb(verbs, "list", adapters_list, "a profile's adapters and the replicas that hold each"), name=False)
    p = verb(verbs, "add", adapters_add, "add a LoRA adapter (its own model name) to a model's profile")
    target(p)
    p.add_argument(
        "--url",
        required=True,
        help="llama.cpp: the GGUF adapter's http(s) URL or path on the nodes; vLLM: its directory on the nodes",
    )
    p.add_argument("--sha256", required=True)
    p.add_argument("--size", type=int, required=True, help="the file's size in bytes")
    p.add_argument("--scale", type=float, default=1.0, help="its scale when applied (default 1.0)")
    target(verb(verbs, "remove", adapters_remove, "remove an adapter from a model's profile"))
    p = verb(verbs, "scale", adapters_scale, "change an adapter's default scale (nothing restarts)")
    target(p)
    p.add_argument("scale", type=float)
