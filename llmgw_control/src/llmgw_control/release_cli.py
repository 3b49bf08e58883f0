"""``llmgw-control release``: the command over ``fleet/node_release`` (what a node release is, and how one is made).

The command reads control's config (for ``agents.files_dir`` and ``data_dir``), which the fleet's
library must not import: the layers run from the CLIs down (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .app import data_dir_of
from .cli_exits import FAILURES, stopped
from .config import load_config
from .fleet.node_release import (
    DEFAULT_ARCHS,
    DEFAULT_PYTHONS,
    RELEASE_ID,
    RELEASES_DIR,
    NodeReleaseError,
    current_id,
    load_release,
    parse_target,
    prepare,
    releases_dir_for,
    use,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw-control release",
        description="Node releases: the exact wheels onboarding installs on nodes, from uv.lock.",
    )
    parser.add_argument(
        "--config",
        help="control's config file, for agents.files_dir and data_dir (default "
        "/etc/llmgw/control.toml when it exists)",
    )
    parser.add_argument("--files-dir", help="control's files directory (default: the config's agents.files_dir)")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    prep = sub.add_parser("prepare", help="pin every wheel llmgw-node needs to uv.lock, and make it current")
    prep.add_argument("--lock", default="uv.lock", help="the lock file (default: ./uv.lock)")
    prep.add_argument(
        "--dist", default="dist", help="where `uv build` put the llmgw-shared and llmgw-node wheels (default: ./dist)"
    )
    prep.add_argument(
        "--python",
        action="append",
        metavar="3.X",
        help=f"a CPython version nodes run (repeatable; default {', '.join(DEFAULT_PYTHONS)})",
    )
    prep.add_argument(
        "--arch",
        action="append",
        metavar="MACHINE",
        help=f"a machine kind nodes run, as `uname -m` prints it (repeatable; default {', '.join(DEFAULT_ARCHS)})",
    )
    prep.add_argument(
        "--wheels-from",
        metavar="DIR_OR_URL",
        help="take the wheels from this directory or URL "
        "(a mirror of files by name) instead of the lock's URLs; each is still checked against "
        "the lock's sha256",
    )
    sub.add_parser("list", help="the prepared releases; * marks the current one")
    use_ = sub.add_parser("use", help="make a prepared release current (rollback: nodes upgrade to it)")
    use_.add_argument("id")
    return parser


def _releases_dir(args: argparse.Namespace) -> Path:
    if args.files_dir:
        return Path(args.files_dir) / RELEASES_DIR
    path = args.config or ("/etc/llmgw/control.toml" if Path("/etc/llmgw/control.toml").exists() else None)
    config = load_config(path, {})
    return releases_dir_for(config.agents.files_dir, data_dir_of(config))


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        releases = _releases_dir(args)
        if args.action == "prepare":
            pythons = args.python or list(DEFAULT_PYTHONS)
            archs = args.arch or list(DEFAULT_ARCHS)
            targets = sorted({parse_target(p, a) for p in pythons for a in archs})
            release_id = prepare(
                Path(args.lock),
                Path(args.dist),
                releases,
                targets,
                wheels_from=args.wheels_from,
                say=lambda text: print(text, file=sys.stderr),
            )
            print(
                f"release {release_id} is current in {releases}; new nodes get it, installed ones with "
                "LLMGW_UPGRADE=1 (docs/operator-guide.md)"
            )
        elif args.action == "use":
            use(releases, args.id)
            print(f"release {args.id} is current")
        else:
            current = current_id(releases)
            found = (
                sorted(p.name for p in releases.iterdir() if RELEASE_ID.fullmatch(p.name)) if releases.is_dir() else []
            )
            if not found:
                print(f"no releases in {releases}: run `llmgw-control release prepare`")
            for release_id in found:
                try:
                    release = load_release(releases, release_id)
                    words = (
                        f"llmgw-node {release.node_version}, {len(release.files)} wheels, "
                        f"{' '.join(release.targets)}, prepared {release.created_at}"
                    )
                except NodeReleaseError as exc:
                    words = f"unusable: {exc}"
                print(f"{'*' if release_id == current else ' '} {release_id}  {words}")
    except FAILURES as exc:
        return stopped("release", exc)
    return 0
