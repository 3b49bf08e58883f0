"""Functions are bounded too: one over ``MAX_LINES`` lines is split, or listed below with its reason.

``admin/api/routes.py::build_api`` had grown to 368 lines of nested routes before anyone split it
(issue 33): a module's size is checked (tests/test_module_size.py), a function's was not. A
function's lines run from its ``def`` to its last line, nested functions included (a route table
of nested handlers is one function to its reader).

``ALLOWED`` is today's exceptions, each with its size then and why it is one function. The list
may only shrink: an entry may not grow past its size, and one that is back under the bound, or
gone, must be removed from the list (the test says so).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = [ROOT / "llmgw_control" / "src", ROOT / "llmgw_node" / "src", ROOT / "shared" / "src", ROOT / "tools"]
# The bound, in lines as `ruff format` lays them out (one argument a line once a call wraps): 99%
# of the tree's 2,400 functions are under 70 lines; over 100 a function is doing several things a
# reader must hold at once.
MAX_LINES = 100

# "path::Class.function": (its lines when listed, why it is one function).
ALLOWED: dict[str, tuple[int, str]] = {
    "llmgw_control/src/llmgw_control/fleet/plan.py::plan": (
        122,
        "the placement pass: its steps share the kept/blocked/budget state (property-tested as a whole)",
    ),
    "llmgw_control/src/llmgw_control/gateway/relay.py::_relay": (
        103,
        "the data path's relay of every answer (status, stream or body, usage); a split is benched first",
    ),
}


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every function and method, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            yield name, (node.end_lineno or node.lineno) - node.lineno + 1
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def _sizes() -> dict[str, int]:
    sizes = {}
    for root in TREES:
        for path in sorted(root.rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            for name, lines in _functions(ast.parse(path.read_text(encoding="utf-8"))):
                sizes[f"{where}::{name}"] = max(lines, sizes.get(f"{where}::{name}", 0))
    return sizes


SIZES = _sizes()


def test_the_functions_are_found() -> None:
    # A moved tree must not make the checks below pass vacuously.
    assert len(SIZES) > 1500
    assert any(name.startswith("tools/") for name in SIZES) and any("llmgw_node" in name for name in SIZES)


def test_the_size_is_counted_from_def_to_the_last_line_nested_functions_included() -> None:
    source = (
        "def outer():\n    def inner():\n        return 1\n\n    return inner\n\n"
        "class C:\n    def m(self):\n        pass\n"
    )
    assert dict(_functions(ast.parse(source))) == {"outer": 5, "outer.inner": 2, "C.m": 2}


def test_no_function_is_over_the_bound_unless_listed() -> None:
    over = {name: lines for name, lines in SIZES.items() if lines > MAX_LINES and name not in ALLOWED}
    assert not over, f"over {MAX_LINES} lines: split them (or, with a reason, list them in ALLOWED): {over}"


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_a_listed_function_only_shrinks(name: str) -> None:
    listed, reason = ALLOWED[name]
    assert reason
    assert name in SIZES, f"{name} is gone: remove it from ALLOWED"
    assert SIZES[name] > MAX_LINES, f"{name} is {SIZES[name]} lines now, within the bound: remove it from ALLOWED"
    assert SIZES[name] <= listed, f"{name} grew from {listed} to {SIZES[name]} lines: split it instead"
