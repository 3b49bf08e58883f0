"""``llmgw-control engines``: files control serves to nodes for their engines (fleet/runtime_wheels).

``engines runtime --cuda 12|13`` puts NVIDIA's CUDA runtime wheels, pinned by sha256, in
``<files_dir>/engines/`` for nodes whose CUDA build's release has no ``cudart-`` archive. Like
``release`` (release_cli.py) it reads control's config only for ``agents.files_dir``.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from llmgw_shared.config import ConfigError

from .cli_exits import FAILURES, stopped
from .config import load_config
from .fleet.runtime_wheels import ARCHS, ENGINES_DIR, PINS_FILE, fetch_runtime


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw-control engines", description="Files control serves nodes for their engines."
    )
    parser.add_argument(
        "--config", help="control's config file, for agents.files_dir (default /etc/llmgw/control.toml when it exists)"
    )
    parser.add_argument("--files-dir", help="control's files directory (default: the config's agents.files_dir)")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    runtime = sub.add_parser(
        "runtime",
        help="fetch NVIDIA's CUDA runtime wheels (pinned by sha256) into "
        "<files_dir>/engines/ for nodes whose CUDA build has no cudart archive",
    )
    runtime.add_argument(
        "--cuda",
        type=int,
        required=True,
        choices=(12, 13),
        help="the CUDA major version of the builds nodes install (12: driver 525 or later; 13: driver 580 or later)",
    )
    runtime.add_argument(
        "--arch",
        action="append",
        choices=ARCHS,
        help="a machine kind nodes run (repeatable; default: this machine's, else x86_64)",
    )
    runtime.add_argument(
        "--wheels-from",
        metavar="DIR_OR_URL",
        help="take the wheels from this directory or URL "
        "(a mirror of files by name) instead of PyPI; each is still checked against its pin",
    )
    return parser


def _files_dir(args: argparse.Namespace) -> Path:
    if args.files_dir:
        return Path(args.files_dir)
    path = args.config or ("/etc/llmgw/control.toml" if Path("/etc/llmgw/control.toml").exists() else None)
    files_dir = load_config(path, {}).agents.files_dir
    if not files_dir:
        raise ConfigError("control serves no files (agents.files_dir is empty): set it, or pass --files-dir")
    return Path(files_dir)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        files_dir = _files_dir(args)
        machine = platform.machine()
        archs = args.arch or [machine if machine in ARCHS else "x86_64"]
        for arch in archs:
            wheels = fetch_runtime(
                files_dir, args.cuda, arch, wheels_from=args.wheels_from, say=lambda text: print(text, file=sys.stderr)
            )
            print(
                f"CUDA {args.cuda} runtime for {arch} in {files_dir / ENGINES_DIR}: "
                + ", ".join(f"{w.project}=={w.version}" for w in wheels)
            )
        print(f"pinned in {files_dir / ENGINES_DIR / PINS_FILE}; control lists them in the release index it serves")
    except FAILURES as exc:
        return stopped("engines", exc)
    return 0
