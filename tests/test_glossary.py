"""One name per thing (issue 33): the glossary in docs/architecture.md is the dictionary a newcomer
reads first, so it must name what the code calls things, and name each thing once.

* every term (first column) is in one row;
* every code name it cites (backticks in the second column) exists: a path, a console script, a
  TOML section (``[router]``: an attribute of a config class), or a Python name -- a module,
  class, function (``name()``) or attribute (``Class.attr``) found by parsing the packages;
* every Python name is cited by one row only, so one name never stands for two terms.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "llmgw_control": ROOT / "llmgw_control/src/llmgw_control",
    "llmgw_node": ROOT / "llmgw_node/src/llmgw_node",
    "llmgw_shared": ROOT / "shared/src/llmgw_shared",
}
# Paths without a package are under control's (as the glossary's opening line says).
DEFAULT_PACKAGE = "llmgw_control"

CODE = re.compile(r"`([^`]+)`")
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?(\(\))?$")
SECTION = re.compile(r"^\[\[?([a-z_]+)\]\]?$")


def glossary_rows(text: str) -> list[tuple[str, str]]:
    """(term, code column) of each row of the table under ``## Glossary``."""
    section = text.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and line.startswith("|") and cells[0] not in ("word", "---"):
            rows.append((cells[0], cells[1]))
    return rows


class Names:
    """What the three packages define: modules, classes, functions, attributes per class."""

    def __init__(self) -> None:
        self.modules: set[str] = set()
        self.classes: dict[str, set[str]] = defaultdict(set)
        self.functions: set[str] = set()
        self.attributes: set[str] = set()
        self.config_fields: set[str] = set()
        self.modules.update(PACKAGES)
        for package in PACKAGES.values():
            for path in package.rglob("*.py"):
                self.modules.add(path.stem)
                self._scan(ast.parse(path.read_text(encoding="utf-8")))

    def _scan(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                members = self.classes[node.name]
                for item in node.body:
                    members.update(_bound(item))
                self.attributes.update(members)
                if node.name.endswith("Config"):
                    self.config_fields.update(members)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                self.attributes.add(node.attr)
        for item in tree.body:
            self.attributes.update(_bound(item))

    def has(self, name: str) -> bool:
        if name.endswith("()"):
            return name[:-2].split(".")[-1] in self.functions
        if "." in name:
            owner, member = name.split(".")
            return member in self.classes.get(owner, set())
        return name in self.classes or name in self.modules or name in self.attributes


def _bound(item: ast.stmt) -> set[str]:
    """The names one statement of a class or module body defines."""
    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
        return {item.target.id}
    if isinstance(item, ast.Assign):
        return {target.id for target in item.targets if isinstance(target, ast.Name)}
    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {item.name}
    return set()


def console_scripts() -> set[str]:
    scripts: set[str] = set()
    for pyproject in ROOT.glob("*/pyproject.toml"):
        scripts.update(tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("scripts", {}))
    return scripts


def path_exists(cited: str) -> bool:
    package, _, rest = cited.partition("/")
    base = PACKAGES.get(package)
    if base is None:
        base, rest = PACKAGES[DEFAULT_PACKAGE], cited
    return (base / rest.rstrip("/")).exists()


def problems_of(rows: list[tuple[str, str]], names: Names, scripts: set[str]) -> list[str]:
    problems = []
    terms: defaultdict[str, int] = defaultdict(int)
    cited_by: defaultdict[str, list[str]] = defaultdict(list)
    for term, code in rows:
        terms[term.lower()] += 1
        cited = CODE.findall(code)
        if not cited:
            problems.append(f"{term!r} cites no code name")
        for name in cited:
            if "/" in name or name.endswith(".py"):
                ok = path_exists(name)
            elif (section := SECTION.match(name)) is not None:
                ok = section.group(1) in names.config_fields
            elif name in scripts:
                ok = True
            elif IDENTIFIER.match(name):
                ok = names.has(name)
                cited_by[name].append(term)
            else:
                ok = False
            if not ok:
                problems.append(f"{term!r} cites {name!r}, which the code does not have")
    problems += [f"{term!r} is in {count} rows" for term, count in terms.items() if count > 1]
    problems += [
        f"{name!r} is cited by {', '.join(map(repr, cited))}" for name, cited in cited_by.items() if len(cited) > 1
    ]
    return problems


def test_the_glossary_names_what_the_code_has_once() -> None:
    rows = glossary_rows((ROOT / "docs/architecture.md").read_text(encoding="utf-8"))
    assert len(rows) > 30  # the table was found
    problems = problems_of(rows, Names(), console_scripts())
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_missing_name_a_shared_name_and_a_twice_defined_term() -> None:
    rows = [
        ("replica", "`Replica`, `ReplicaShard`"),
        ("replica set", "`Replica` (`gateway/nowhere.py`)"),
        ("slot", "`Slot`"),
        ("Slot", "`gateway/activator.py`"),
        ("toml", "`[nosuchsection]`"),
    ]
    problems = problems_of(rows, Names(), console_scripts())
    assert problems == [
        "'replica' cites 'ReplicaShard', which the code does not have",
        "'replica set' cites 'gateway/nowhere.py', which the code does not have",
        "'toml' cites '[nosuchsection]', which the code does not have",
        "'slot' is in 2 rows",
        "'Replica' is cited by 'replica', 'replica set'",
    ]
