"""The import layers of docs/architecture.md hold: import-linter's contracts (root pyproject.toml).

A package imports only those below it (tenancy does not reach into the gateway for its errors,
admin/ not into app.py for the Fleet type, config.py and the packages it composes not into each
other), llmgw_shared imports neither daemon, and the node never imports control.
"""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_layers_hold() -> None:
    # The report (which import breaks which contract) is printed, and shown when this fails.
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0
