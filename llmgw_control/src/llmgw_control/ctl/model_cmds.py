"""``ctl models list|show|add|change|remove``: the catalog from a terminal.

The noun's other verbs are declared by mirror_cmds.py (search, files, pull, pulls, publish) and
adapter_cmds.py (adapters).
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any, TextIO

from .adapter_cmds import add_adapter_verbs
from .client import AdminClient, CtlError
from .common import Nouns, emit, q, said
from .mirror_cmds import add_mirror_verbs
from .tables import mib, table


def models_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/models")

    def human() -> str:
        if not answer["models"]:
            return "no models (add one with: llmgw-control ctl models add --file model.toml)"
        rows = [
            [
                m["key"],
                m["source"],
                f"{m['ready']}/{len(m['replicas'])}",
                m["waiting_requests"],
                mib(m["claim"]["ram_mib"]),
                m["status"],
            ]
            for m in answer["models"]
        ]
        return table(["MODEL", "SOURCE", "READY", "WAITING", "RAM", "STATUS"], rows)

    emit(out, args, answer, human)


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
        emit(out, args, answer, said(f"model {answer['model']['name']} added"))


def models_change(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    for entry in read_model_file(args.file):
        name = entry.get("name")
        if not isinstance(name, str):
            raise CtlError(f"{args.file}: the model entry has no name")
        answer = client.put(f"/models/{q(name)}", entry)
        emit(out, args, answer, said(f"model {answer['model']['name']} changed"))


def models_show(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get(f"/models/{q(args.name)}")
    emit(out, args, answer, lambda: json.dumps(answer, indent=2))


def models_remove(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    client.delete(f"/models/{q(args.name)}")
    emit(out, args, {"removed": args.name}, lambda: f"model {args.name} removed (its replicas are draining)")


def add_models(nouns: Nouns) -> None:
    v = nouns.noun(
        "models",
        "models: list (default), show, add, change, remove, adapters, search, files, pull, pulls, publish",
        models_list,
    )
    nouns.verb(v, "list", models_list, "every model profile with its replicas and status")
    nouns.verb(v, "show", models_show, "a model's definition").add_argument("name")
    nouns.verb(v, "add", models_add, "add the model(s) in a TOML or JSON file").add_argument("--file", required=True)
    nouns.verb(v, "change", models_change, "replace a model with the definition in a file").add_argument(
        "--file", required=True
    )
    nouns.verb(v, "remove", models_remove, "remove a model (its replicas are drained)").add_argument("name")
    add_mirror_verbs(v, nouns.verb)
    add_adapter_verbs(v, nouns.verb, nouns.common)
