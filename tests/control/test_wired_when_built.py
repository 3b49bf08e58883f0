"""app.py wires the daemon's parts when it builds them: it hands each what it needs in its
constructor, and never sets an attribute of a part it built (``agents.report_to``,
``reconciler.on_replica_forgotten = ...`` and ``live.queues = ...`` were, issue 33)."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "llmgw_control" / "src" / "llmgw_control" / "app.py"


def test_app_sets_no_attribute_of_what_it_built() -> None:
    tree = ast.parse(APP.read_text(encoding="utf-8"))
    set_after = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            # A class's own ``self.x = ...`` in its constructor is building, not wiring.
            set_after += [f"line {node.lineno}: {ast.unparse(t)}" for t in targets if isinstance(t, ast.Attribute)
                          and not (isinstance(t.value, ast.Name) and t.value.id == "self")]
    assert set_after == [], "hand it to the constructor instead"
