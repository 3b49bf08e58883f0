"""``ctl models search|files|pull|pulls|publish``: the model mirror from a terminal."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import quote

from .client import AdminClient, CtlError
from .tables import table
from .terminal import control

Action = Callable[[AdminClient, argparse.Namespace, TextIO], None]
Verb = Callable[[Any, str, Action, str], argparse.ArgumentParser]

# How often ``pull`` asks for progress: often enough for a live bar, rare enough to be no load.
POLL_SECONDS = 0.5
BAR_WIDTH = 30
RUNNING = ("queued", "downloading", "verifying")
# The bar is redrawn in place: back to the line's start, then erase what a longer bar left.
_ERASE_LINE_END = "\x1b[K"


def size_words(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def progress_bar(pull: dict[str, Any]) -> str:
    """``[#####.....]  42%  1.2 GiB / 2.9 GiB  35.0 MiB/s  ETA 48 s  downloading``"""
    total, done = pull["size"] or 0, pull["bytes"]
    share = done / total if total else 0.0
    filled = int(share * BAR_WIDTH)
    eta = pull.get("eta_seconds")
    return (
        f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {share * 100:3.0f}%  {size_words(done)} / "
        f"{size_words(total)}  {size_words(pull['rate'])}/s  "
        f"{'ETA ' + str(round(eta)) + ' s' if eta is not None else ''}  {pull['state']}"
    )


def _emit(out: TextIO, args: argparse.Namespace, answer: Any, human: Callable[[], str]) -> None:
    import json

    out.write((json.dumps(answer, indent=2) if args.json else human()) + "\n")


def models_search(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/hub/search", q=args.text, limit=args.limit)
    _emit(
        out,
        args,
        answer,
        lambda: (
            table(
                ["REPOSITORY", "DOWNLOADS", "LIKES", "UPDATED"],
                [[r["id"], r["downloads"], r["likes"], r["updated"][:10]] for r in answer["repos"]],
            )
            if answer["repos"]
            else f"no GGUF repositories match {args.text!r} on {answer['endpoint']}"
        ),
    )


def models_files(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/hub/files", repo=args.repo, revision=args.revision)

    def fits(f: dict[str, Any]) -> str:
        return "-" if f["fits"] is None else "yes" if f["fits"] else "no"

    _emit(
        out,
        args,
        answer,
        lambda: (
            table(
                ["FILE", "QUANT", "SIZE", "RAM (est.)", "FITS"],
                [
                    [
                        f["path"],
                        f["quantisation"] or "-",
                        size_words(f["size"]),
                        size_words(f["estimate_ram_mib"] * 2**20),
                        fits(f) + (" (split: not pulled yet)" if f["split"] else ""),
                    ]
                    for f in answer["files"]
                ],
            )
            if answer["files"]
            else f"{args.repo} has no GGUF files"
        ),
    )


def _draft_words(pull: dict[str, Any]) -> str:
    draft = pull["draft"]
    profile = draft["profiles"][0]
    return (
        f"pulled {pull['name']} ({size_words(pull['size'])}, sha256 {pull['sha256'][:12]}...): draft model "
        f"{draft['name']!r}, context {profile['context']}, about {pull['estimate_ram_mib']} MiB RAM "
        f"({pull['estimate_how']}).\nchange it with PUT /api/v1/models/pulls/{pull['id']}/draft, then: "
        f"llmgw-control ctl models publish {pull['id']}"
    )


def models_pull(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    body = {"repo": args.repo, "file": args.file, "revision": args.revision}
    if args.model:
        body["model"] = args.model
    pull = client.post("/models/pulls", body)["pull"]
    if args.no_wait:
        _emit(out, args, {"pull": pull}, lambda: f"pull {pull['id']} started ({pull['state']})")
        return
    shown = False
    while pull["state"] in RUNNING:
        if not args.json:
            control(out, "\r")
            out.write(progress_bar(pull))
            control(out, _ERASE_LINE_END)
            out.flush()
            shown = True
        time.sleep(POLL_SECONDS)
        pull = client.get(f"/models/pulls/{quote(pull['id'], safe='')}")["pull"]
    if shown:
        control(out, "\r")
        out.write(progress_bar(pull))
        control(out, _ERASE_LINE_END)
        out.write("\n")
    if pull["state"] != "ready":
        raise CtlError(f"pull {pull['id']} {pull['state']}: {pull['error']}")
    _emit(out, args, {"pull": pull}, lambda: _draft_words(pull))


def models_pulls(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/models/pulls")
    _emit(
        out,
        args,
        answer,
        lambda: (
            table(
                ["ID", "STATE", "FILE", "PROGRESS", "MODEL"],
                [
                    [
                        p["id"],
                        p["state"],
                        p["name"],
                        f"{size_words(p['bytes'])} / {size_words(p['size'])}",
                        (p["draft"] or {}).get("name", "-") + (f" ({p['error']})" if p["error"] else ""),
                    ]
                    for p in answer["pulls"]
                ],
            )
            if answer["pulls"]
            else "no pulls"
        ),
    )


def models_publish(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.post(f"/models/pulls/{quote(args.pull, safe='')}/publish")
    _emit(out, args, answer, lambda: f"model {answer['model']['name']} added to the catalog")


def add_mirror_verbs(verbs: Any, verb: Verb) -> None:
    p = verb(verbs, "search", models_search, "search the Hub for GGUF repositories")
    p.add_argument("text")
    p.add_argument("--limit", type=int)
    p = verb(verbs, "files", models_files, "a Hub repository's GGUF files, their size and fit on the fleet")
    p.add_argument("repo", help="owner/name")
    p.add_argument("--revision", default="main")
    p = verb(verbs, "pull", models_pull, "pull a GGUF file from the Hub into control (a draft model when done)")
    p.add_argument("repo", help="owner/name")
    p.add_argument("file", help="the .gguf file's path in the repository")
    p.add_argument("--revision", default="main")
    p.add_argument("--model", help="the draft model's name (default: from the file name)")
    p.add_argument("--no-wait", action="store_true", help="start the pull and return")
    verb(verbs, "pulls", models_pulls, "every pull with its state")
    verb(verbs, "publish", models_publish, "add a ready pull's draft model to the catalog").add_argument("pull")
