"""One name per thing (issue 33): no two public classes in the three packages share a name, so a
name met in a traceback, a log line or a review means one class. Two ``Plan``s, three ``Target``s
and two ``Supervisor``s were how a newcomer got lost."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [
    ROOT / "llmgw_control/src/llmgw_control",
    ROOT / "llmgw_node/src/llmgw_node",
    ROOT / "shared/src/llmgw_shared",
]


def public_classes(source: str) -> list[str]:
    """The public classes a module defines at its top level (a class inside a function is local)."""
    return [
        node.name for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
    ]


def test_no_two_public_classes_share_a_name() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            for name in public_classes(path.read_text(encoding="utf-8")):
                where[name].append(str(path.relative_to(ROOT)))
    assert len(where) > 300  # the scan found the packages
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert shared == {}, "give each class a name of its own: " + "; ".join(
        f"{name} in {', '.join(paths)}" for name, paths in sorted(shared.items())
    )


def test_the_scan_sees_a_clash() -> None:
    source = "class Plan:\n    pass\nclass _Local:\n    pass\ndef f():\n    class Inner: ...\n"
    assert public_classes(source) == ["Plan"]
