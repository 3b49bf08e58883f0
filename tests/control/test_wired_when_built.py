"""app.py wires the daemon's parts when it builds them: it hands each what it needs in its
constructor, and never sets an attribute of a part it built (``agents.report_to``,
``reconciler.on_replica_forgotten = ...`` and ``live.queues = ...`` were, issue 33). The
gateway, built from parts app.py built, wires none of them either (its constructor called
``metrics.live.show_queues(...)``: the live window gets its queues when built)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "llmgw_control" / "src" / "llmgw_control"
APP = SRC / "app.py"
GATEWAY = SRC / "gateway" / "gateway.py"


def test_app_sets_no_attribute_of_what_it_built() -> None:
    tree = ast.parse(APP.read_text(encoding="utf-8"))
    set_after = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            # A class's own ``self.x = ...`` in its constructor is building, not wiring.
            set_after += [
                f"line {node.lineno}: {ast.unparse(t)}"
                for t in targets
                if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self")
            ]
    assert set_after == [], "hand it to the constructor instead"


def test_the_gateway_constructor_only_sets_its_own_attributes() -> None:
    """Every statement of ``Gateway.__init__`` is ``self.x = ...``: no call made for its effect on a
    part it was handed (that is wiring after the part was built), no attribute set on one."""
    tree = ast.parse(GATEWAY.read_text(encoding="utf-8"))
    (init,) = [
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == "Gateway"
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
    ]
    wiring = []
    for statement in init.body:
        own = isinstance(statement, ast.Assign) and all(
            isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
            for t in statement.targets
        )
        if not own:
            wiring.append(f"line {statement.lineno}: {ast.unparse(statement)}")
    assert wiring == [], "hand it to that part's constructor instead"
