"""``llmgw-control ctl <noun> <verb>``: the admin REST API from a terminal.

Talks only to the API (``--admin URL``, default the local admin listener), so whatever it can do
a script or the dashboard can do too. Tables for people by default, the API's JSON with
``--json``; an error from the API is printed as the API said it, with a non-zero exit.

Each noun is a module that declares its verbs (``node_cmds.py``, ``model_cmds.py``, ...: one small
function per command over one client); ``build_parser`` composes them in the order ``--help``
lists them.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from .audit_cmds import add_audit
from .bench_cmds import add_bench, add_capacity_verbs, capacity_runs
from .client import DEFAULT_ADMIN, AdminClient, CtlError
from .common import Nouns
from .group_cmds import add_groups, add_quotas
from .key_cmds import add_keys, add_sessions
from .model_cmds import add_models
from .node_cmds import add_nodes
from .replica_cmds import add_engines, add_replicas, add_weights
from .terminal import TerminalOut
from .usage_cmds import add_usage


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--admin", default=argparse.SUPPRESS, help=f"the admin API's base URL (default {DEFAULT_ADMIN})"
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON instead of a table"
    )
    parser = argparse.ArgumentParser(
        prog="llmgw-control ctl", parents=[common], description="Manage llmgw through its admin REST API."
    )
    nouns = Nouns(parser.add_subparsers(dest="noun", required=True, metavar="NOUN"), common)
    add_nodes(nouns)
    add_models(nouns)
    add_replicas(nouns)
    add_engines(nouns)
    add_weights(nouns)
    add_bench(nouns.subparsers, common)
    add_capacity_verbs(nouns.noun("capacity", "capacity: runs (default)", capacity_runs), nouns.verb)
    add_groups(nouns)
    add_keys(nouns)
    add_quotas(nouns)
    add_sessions(nouns)
    add_audit(nouns)
    add_usage(nouns)
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
