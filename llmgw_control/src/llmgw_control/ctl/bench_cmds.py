"""``ctl bench MODEL[:PROFILE]`` and ``ctl capacity runs``: capacity runs from a terminal.

``bench`` starts a run (``POST /api/v1/capacity/runs``) and follows it, printing one line per
level as it finishes; it exits 0 when the run is done, 1 when it failed or was cancelled. Ctrl-C
cancels the run before exiting (a sweep nobody watches should not hold a replica).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import quote

from ..catalog.profile_key import ProfileKey
from .client import AdminClient, CtlError
from .tables import table

Action = Callable[[AdminClient, argparse.Namespace, TextIO], None]
Verb = Callable[[Any, str, Action, str], argparse.ArgumentParser]

# How often ``bench`` asks for progress: a level lasts seconds, so a line appears promptly.
POLL_SECONDS = 0.5
FINISHED = ("done", "failed", "cancelled")


def level_line(level: dict[str, Any]) -> str:
    """``c=4  gen 123.4 tok/s  prompt 456.7 tok/s  TTFT p50 0.052 p99 0.560 s  ITL p50 ...``"""
    meets = {True: "  meets the objective", False: "  misses the objective", None: ""}[level["meets_objective"]]
    return (
        f"c={level['concurrency']:<4} gen {level['generation_tokens_per_s']:8.1f} tok/s  "
        f"prompt {level['prompt_tokens_per_s']:8.1f} tok/s  "
        f"TTFT p50 {level['ttft_p50_s']:.3f} p99 {level['ttft_p99_s']:.3f} s  "
        f"ITL p50 {level['itl_p50_s']:.3f} p99 {level['itl_p99_s']:.3f} s  "
        f"{level['requests']} req, {level['errors']} err{meets}"
    )


def _levels(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CtlError(f"--levels: {text!r} is not a comma-separated list of numbers (e.g. 1,2,4,8)") from None


def bench(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    body: dict[str, Any] = {"model": args.model}
    for name in ("node", "prompt_tokens", "output_tokens", "level_seconds"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    levels = _levels(args.levels)
    if levels is not None:
        body["levels"] = levels
    run = client.post("/capacity/runs", body)["run"]
    if args.no_wait:
        _emit(out, args, {"run": run}, lambda: f"capacity run {run['id']} started ({run['state']})")
        return
    path = f"/capacity/runs/{quote(run['id'], safe='')}"
    if not args.json:
        out.write(
            f"capacity run {run['id']}: {ProfileKey(run['model'], run['profile'])}, levels "
            f"{','.join(map(str, run['levels']))}, {run['level_seconds']:g} s each\n"
        )
        out.flush()
    shown, placed = 0, False
    try:
        while True:
            if not args.json:
                if run["node_id"] and not placed:
                    placed = True
                    how = "started for the run" if run["started_replica"] else "already running"
                    out.write(f"replica {run['replica_id']} on node {run['node_id']} ({how})\n")
                for level in run["results"][shown:]:
                    out.write(level_line(level) + "\n")
                shown = len(run["results"])
                out.flush()
            if run["state"] in FINISHED:
                break
            time.sleep(POLL_SECONDS)
            run = client.get(path)["run"]
    except KeyboardInterrupt:
        # Best effort: the run may have ended meanwhile (409), or the daemon be gone.
        try:
            client.delete(path)
            out.write(f"\ncapacity run {run['id']} cancelled\n")
        except CtlError:
            pass
        raise
    if args.json:
        out.write(json.dumps({"run": run}, indent=2) + "\n")
    if run["state"] != "done":
        raise CtlError(f"capacity run {run['id']} {run['state']}" + (f": {run['error']}" if run["error"] else ""))
    if not args.json:
        slots = run["slots"]
        out.write(
            f"done: {slots} slot(s) meet the profile's objective on this kind of node\n"
            if slots is not None
            else "done (the profile sets no latency objective: slots stay its parallel)\n"
        )


def _emit(out: TextIO, args: argparse.Namespace, answer: Any, human: Callable[[], str]) -> None:
    out.write((json.dumps(answer, indent=2) if args.json else human()) + "\n")


def capacity_runs(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.get("/capacity/runs", model=getattr(args, "model", None))

    def best(run: dict[str, Any]) -> str:
        top = max((lv["generation_tokens_per_s"] for lv in run["results"]), default=0.0)
        return f"{top:.1f}" if run["results"] else "-"

    _emit(
        out,
        args,
        answer,
        lambda: (
            table(
                ["ID", "MODEL", "STATE", "NODE", "LEVELS", "BEST GEN TOK/S", "SLOTS", "ENGINE"],
                [
                    [
                        r["id"],
                        str(ProfileKey(r["model"], r["profile"])),
                        r["state"] + (f" ({r['error']})" if r["error"] else ""),
                        r["node_id"] or r["node"] or "-",
                        f"{r['levels_done']}/{len(r['levels'])}",
                        best(r),
                        "-" if r["slots"] is None else r["slots"],
                        f"{r['comparable'].get('engine', '')} {r['comparable'].get('engine_version', '')}".strip()
                        or "-",
                    ]
                    for r in answer["runs"]
                ],
            )
            if answer["runs"]
            else "no capacity runs"
        ),
    )


def add_bench(nouns: Any, common: argparse.ArgumentParser) -> None:
    p = nouns.add_parser("bench", help="bench MODEL[:PROFILE]: a capacity run, a line per level", parents=[common])
    p.set_defaults(action=bench)
    p.add_argument("model", metavar="MODEL[:PROFILE]")
    p.add_argument("--node", help="measure a replica on this node (one is started there if none runs)")
    p.add_argument("--levels", help="concurrency levels, comma-separated (default 1,2,4,8)")
    p.add_argument("--prompt-tokens", type=int, dest="prompt_tokens", help="the fixed prompt's length (default 128)")
    p.add_argument("--output-tokens", type=int, dest="output_tokens", help="tokens generated per request (default 64)")
    p.add_argument("--level-seconds", type=float, dest="level_seconds", help="seconds per level (default 10)")
    p.add_argument("--no-wait", action="store_true", help="start the run and return")


def add_capacity_verbs(verbs: Any, verb: Verb) -> None:
    p = verb(verbs, "runs", capacity_runs, "capacity runs, newest first")
    p.add_argument("--model", default=argparse.SUPPRESS, help="only this model's runs")
