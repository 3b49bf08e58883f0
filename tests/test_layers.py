"""The import layers of docs/architecture.md hold: import-linter's contracts (root pyproject.toml).

A package imports only those below it (tenancy does not reach into the gateway for its errors,
admin/ not into app.py for the Fleet type, config.py and the packages it composes not into each
other), llmgw_shared imports neither daemon, and the node never imports control.
"""

from __future__ import annotations

import logging
from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_layers_hold() -> None:
    # import-linter configures logging as a program would, which disables every logger that
    # exists by then: a later test reading caplog would see nothing (they are enabled again).
    loggers = [
        logger
        for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger) and not logger.disabled
    ]
    try:
        # The report (which import breaks which contract) is printed, and shown when this fails.
        assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0
    finally:
        for logger in loggers:
            logger.disabled = False


def test_every_part_of_control_is_in_a_layer() -> None:
    # A module left out of the contract is checked by nothing: workers.py and release_cli.py were
    # (issue 33). Every top-level module and package of llmgw_control is named in one layer.
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [layers] = [c["layers"] for c in contracts if c.get("containers") == ["llmgw_control"]]
    named = {part.strip() for layer in layers for part in layer.split("|")}
    package = ROOT / "llmgw_control" / "src" / "llmgw_control"
    parts = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    parts |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    assert parts - named == set(), "not in any layer of pyproject.toml's llmgw_control contract"
