"""A pattern written to match a whole value is matched with ``fullmatch``, everywhere.

``re.match(r"^x$", "x\\n")`` and ``re.search`` succeed: ``$`` also matches before a trailing
newline. That is how a node id with a newline was welcomed, and why a model named ``"tiny\\n"``
would have been accepted. This scans every module of the three packages for ``match``/``search``
calls on a pattern anchored with ``$`` (a module-level compiled one or a literal) and fails on
each, naming the place; then it shows the daemon refusing such values on the real sockets.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from llmgw_control.config import ControlConfig, validate
from llmgw_control.fleet.agents import AgentsConfig
from llmgw_control.gateway.config import StaticReplicaConfig
from llmgw_shared.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "shared" / "src", ROOT / "llmgw_control" / "src", ROOT / "llmgw_node" / "src"]


def _anchored(pattern: object) -> bool:
    return isinstance(pattern, str | bytes) and str(pattern).endswith("$") and not str(pattern).endswith("\\$")


def _patterns(tree: ast.Module) -> dict[str, object]:
    """Module-level ``NAME = re.compile(<literal>, ...)`` assignments."""
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = node.value
            if isinstance(call.func, ast.Attribute) and call.func.attr == "compile" and call.args:
                try:
                    literal = ast.literal_eval(call.args[0])
                except ValueError:
                    continue
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = literal
    return found


def half_anchored_matches() -> list[str]:
    places = []
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            compiled = _patterns(tree)
            for node in ast.walk(tree):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("match", "search")
                ):
                    continue
                owner = node.func.value
                pattern: object = None
                if isinstance(owner, ast.Name) and owner.id in compiled:
                    pattern = compiled[owner.id]
                elif isinstance(owner, ast.Name) and owner.id == "re" and node.args:
                    try:
                        pattern = ast.literal_eval(node.args[0])
                    except ValueError:
                        pattern = None
                if _anchored(pattern):
                    places.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.attr} with {pattern!r}")
    return places


def test_no_pattern_anchored_with_a_dollar_is_matched_with_match_or_search() -> None:
    assert half_anchored_matches() == []


def test_the_scan_finds_what_it_is_for(tmp_path: Path) -> None:
    tree = ast.parse('import re\nNAME = re.compile(r"^[a-z]+$")\nok = NAME.match(x)\nre.search(r"^a$", y)\n')
    assert set(_patterns(tree)) == {"NAME"}
    assert re.match(r"^[a-z]+$", "abc\n")  # the behaviour the scan exists for


def _with_endpoint_id(endpoint_id: str) -> ControlConfig:
    return ControlConfig(endpoints=[StaticReplicaConfig(id=endpoint_id, url="http://127.0.0.1:9", models=["m"])])


@pytest.mark.parametrize(
    "config",
    [
        ControlConfig(admin_hosts=["control.example\n"]),
        _with_endpoint_id("e1\n"),
        ControlConfig(agents=AgentsConfig(join_token_digests=["sha256:" + "a" * 64 + "\n"])),
    ],
    ids=["admin_hosts", "endpoint id", "join token digest"],
)
def test_the_config_refuses_a_trailing_newline(config: ControlConfig) -> None:
    with pytest.raises(ConfigError):
        validate(config)


def test_an_api_schema_pattern_is_matched_whole() -> None:
    from llmgw_control.admin.api.validate import _check_value
    from llmgw_control.api_errors import AdminApiError

    rules = {"pattern": "^[a-z0-9]+$"}
    _check_value("n1", rules, "name")
    with pytest.raises(AdminApiError):
        _check_value("n1\n", rules, "name")
