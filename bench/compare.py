"""Two builds of the gateway in one run: what a change costs the data path, before against after.

    .venv/bin/python bench/compare.py --before /path/to/old/checkout            # 3 rounds each
    .venv/bin/python bench/compare.py --before REV --rounds 2 --quick           # a git revision

``bench/run.py`` measures one gateway against a direct connection. A change's cost is the
difference between two such runs, and on a shared 2-core machine two runs minutes apart differ by
more than most changes do (docs/performance.md: figures move by a third). So the two builds are
run *interleaved*, before, after, before, after, ..., each round the same ``bench/run.py`` load
with the same fake engine, and compared per scenario by the median over the rounds of the
gateway's CPU per request and its added p50 latency. What one round of noise does to one build it
does, on average, to both.

``--before`` is either a directory holding another checkout with its own ``.venv`` (the tree whose
``.venv/bin/llmgw-control`` is measured), or a git revision of this repository, which is checked
out into a temporary worktree with its own environment (``uv sync --frozen``) first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
Key = tuple[str, int]


@contextmanager
def _checkout(before: str) -> Iterator[Path]:
    """A tree with a built environment for ``before``: the directory itself, or a temporary worktree."""
    path = Path(before)
    if (path / ".venv" / "bin" / "llmgw-control").exists():
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="llmgw-compare-") as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), before], check=True)
        try:
            uv = shutil.which("uv") or str(next((Path.home() / ".cache" / "llmgw" / "uv").glob("*/uv")))
            subprocess.run([uv, "sync", "--frozen", "--quiet", "--python", sys.executable], cwd=tree, check=True)
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def _one_round(gateway: Path, out: Path, extra: list[str]) -> list[dict[str, Any]]:
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--gateway", str(gateway), "--json", str(out), *extra],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    return rows


def _collect(rows: list[dict[str, Any]], into: dict[Key, dict[str, list[float]]]) -> None:
    for row in rows:
        via, direct = row["via"], row["direct"]
        if via is None or row["gateway_cpu_ms_per_request"] is None:
            continue
        figures = into.setdefault((row["mode"], row["concurrency"]), {"cpu": [], "added": [], "rps": []})
        figures["cpu"].append(row["gateway_cpu_ms_per_request"])
        figures["added"].append(via["p50_ms"] - direct["p50_ms"])
        figures["rps"].append(via["rps"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compare two gateway builds, interleaved, in one run.")
    parser.add_argument("--before", required=True, help="a checkout with a .venv, or a git revision")
    parser.add_argument("--after", type=Path, default=ROOT, help="a checkout with a .venv (default: this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="bench/run.py --quick rounds")
    parser.add_argument("--concurrency", type=int, action="append", help="default: bench/run.py's (1, 32, 128)")
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args(argv)
    extra = ["--quick"] if args.quick else []
    for c in args.concurrency or []:
        extra += ["--concurrency", str(c)]
    results: dict[str, dict[Key, dict[str, list[float]]]] = {"before": {}, "after": {}}
    with _checkout(args.before) as before, tempfile.TemporaryDirectory(prefix="llmgw-compare-out-") as tmp:
        builds = {
            "before": before / ".venv" / "bin" / "llmgw-control",
            "after": args.after / ".venv" / "bin" / "llmgw-control",
        }
        print(f"before: {before}\nafter:  {args.after}\n{args.rounds} interleaved rounds of bench/run.py {extra}")
        for n in range(args.rounds):
            for name, gateway in builds.items():
                print(f"round {n + 1}: {name} ...", flush=True)
                _collect(_one_round(gateway, Path(tmp) / f"{name}-{n}.json", extra), results[name])
    print(
        f"\n{'scenario':<18}{'cpu/req before':>16}{'after':>9}{'ratio':>8}"
        f"{'added p50 before':>19}{'after':>9}{'req/s before':>15}{'after':>9}"
    )
    medians: list[dict[str, Any]] = []
    for key in sorted(results["after"]):
        b, a = results["before"].get(key), results["after"][key]
        if b is None:
            continue
        row: dict[str, float] = {}
        for name, figures in (("before", b), ("after", a)):
            for metric, values in figures.items():
                row[f"{metric}_{name}"] = round(statistics.median(values), 3)
        medians.append({"mode": key[0], "concurrency": key[1], **row})
        ratio = row["cpu_after"] / row["cpu_before"] if row["cpu_before"] else float("nan")
        print(
            f"{key[0] + ' c=' + str(key[1]):<18}{row['cpu_before']:>14.2f}ms{row['cpu_after']:>7.2f}ms"
            f"{ratio:>8.2f}{row['added_before']:>17.2f}ms{row['added_after']:>7.2f}ms"
            f"{row['rps_before']:>15.0f}{row['rps_after']:>9.0f}"
        )
    if args.json:
        args.json.write_text(json.dumps(medians, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
