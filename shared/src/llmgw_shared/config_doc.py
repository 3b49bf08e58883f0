"""A commented TOML config written from the attrs config classes themselves (``init``).

Generating from the classes means a new option appears in ``init``'s output the day it is
added; the one-line help comes from the field's ``metadata["doc"]`` or from a table the daemon
keeps next to its ``init`` command, and ``missing_docs`` (checked by the tests) names any field
that has neither, so the help cannot fall behind either. Values are written by tomli-w, so
quoting and escaping are TOML's, not ours.

Lists of tables that are empty by default (``[[models]]``, ``[[endpoints]]``) are written as a
commented example between marker lines, so the file shows their shape without declaring any.
"""

from __future__ import annotations

import os
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import tomli_w

EXAMPLE_BEGIN = "# >>> example"
EXAMPLE_END = "# <<< end of example"


def doc(text: str) -> dict[str, str]:
    """A field's metadata carrying its one-line help: ``attrs.field(default=..., metadata=doc("..."))``."""
    return {"doc": text}


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _attrs_class(tp: Any) -> type | None:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        # An optional section (``WeightsConfig | None``): its fields are options all the same.
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        return _attrs_class(members[0]) if len(members) == 1 else None
    return tp if isinstance(tp, type) and attrs.has(tp) else None


def _list_of_attrs(tp: Any) -> type | None:
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (None,)
        return _attrs_class(item)
    return None


def field_default(field: attrs.Attribute[Any]) -> Any:
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory()
    return default


def walk(cls: type, prefix: str = "") -> list[tuple[type, str, str]]:
    """Every (class, field name, dotted path) reachable from ``cls``, nested classes included."""
    out: list[tuple[type, str, str]] = []
    hints = _hints(cls)
    for field in attrs.fields(cls):
        path = f"{prefix}{field.name}"
        out.append((cls, field.name, path))
        tp = hints[field.name]
        nested = _attrs_class(tp) or _list_of_attrs(tp)
        if nested is not None:
            out.extend(walk(nested, f"{path}."))
    return out


def doc_of(cls: type, name: str, docs: Mapping[str, str]) -> str | None:
    field = attrs.fields_dict(cls)[name]
    doc = field.metadata.get("doc") or docs.get(f"{cls.__name__}.{name}")
    return str(doc) if doc else None


def missing_docs(cls: type, docs: Mapping[str, str]) -> list[str]:
    """Dotted paths of fields without a one-line help (the tests require none)."""
    return sorted({f"{c.__name__}.{n}" for c, n, _ in walk(cls) if not doc_of(c, n, docs)})


def toml_value(value: Any) -> str:
    """One value as TOML, e.g. ``"a"``, ``5.0``, ``["x"]``, ``{ k = "v" }``."""
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        return "{ " + ", ".join(_assignment(k, v) for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        # One line, whatever tomli-w's layout for long arrays: the comment above stays with it.
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    rendered = tomli_w.dumps({"v": value}).strip()
    return rendered.removeprefix("v = ")


def _assignment(key: str, value: Any) -> str:
    # tomli-w quotes a key only when it must.
    if isinstance(value, Mapping):
        key_text = tomli_w.dumps({key: 0}).strip().rsplit(" = ", 1)[0]
        return f"{key_text} = {toml_value(value)}"
    if isinstance(value, list | tuple):
        key_text = tomli_w.dumps({key: 0}).strip().rsplit(" = ", 1)[0]
        return f"{key_text} = {toml_value(value)}"
    return tomli_w.dumps({key: value}).strip()


def _comment(text: str) -> list[str]:
    return [f"# {line}" if line else "#" for line in text.splitlines()]


class _Writer:
    def __init__(self, docs: Mapping[str, str], examples: Mapping[str, Any]) -> None:
        self.docs = docs
        self.examples = examples
        self.lines: list[str] = []

    def emit(self, line: str = "") -> None:
        self.lines.append(line)

    def help(self, cls: type, name: str, default_text: str | None) -> None:
        doc = doc_of(cls, name, self.docs) or "(undocumented)"
        self.emit(f"# {doc} Default: {default_text}." if default_text else f"# {doc}")

    def table(self, obj: Any, path: str, *, header: str | None, defaults: bool = True) -> None:
        cls = type(obj)
        hints = _hints(cls)
        fields = attrs.fields(cls)
        scalars = [f for f in fields if not (_attrs_class(hints[f.name]) or _list_of_attrs(hints[f.name]))]
        nested = [f for f in fields if f not in scalars]
        if header is not None:
            self.emit(header)
        for field in scalars:
            value = getattr(obj, field.name)
            default = field_default(field) if field.default is not attrs.NOTHING else attrs.NOTHING
            if defaults:
                default_text = "required" if default is attrs.NOTHING else _default_text(default)
                self.help(cls, field.name, default_text)
            if value is None:
                # TOML has no null: an unset optional stays commented out.
                self.emit(f"# {field.name} =")
            else:
                self.emit(_assignment(field.name, value))
        # TOML puts a table's own keys before its sub-tables: nested sections come last.
        for field in nested:
            child_path = f"{path}{field.name}"
            value = getattr(obj, field.name)
            self.emit()
            if _attrs_class(hints[field.name]):
                self.help(cls, field.name, None)
                self.table(value, f"{child_path}.", header=f"[{child_path}]")
                continue
            self.help(cls, field.name, _list_default_text(field))
            if value:
                for item in value:
                    self.table(item, f"{child_path}.", header=f"[[{child_path}]]")
                    self.emit()
            elif child_path in self.examples:
                self.example(child_path, self.examples[child_path])

    def example(self, path: str, items: list[Any]) -> None:
        inner = _Writer(self.docs, {})
        for item in items:
            inner.table(item, f"{path}.", header=f"[[{path}]]")
            inner.emit()
        self.emit(f"{EXAMPLE_BEGIN} (uncomment to use)")
        for line in inner.lines:
            self.emit(f"# {line}" if line else "#")
        self.emit(EXAMPLE_END)


def _default_text(value: Any) -> str:
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    return toml_value(value)


def _list_default_text(field: attrs.Attribute[Any]) -> str:
    value = field_default(field)
    if not value:
        return "none"
    return f"{len(value)} entr{'y' if len(value) == 1 else 'ies'}, as written below"


def render(
    config: Any, docs: Mapping[str, str], *, header: str, examples: Mapping[str, list[Any]] | None = None
) -> str:
    """``config`` as commented TOML: every option with its help and default; ``header`` on top."""
    writer = _Writer(docs, examples or {})
    for line in _comment(header):
        writer.emit(line)
    writer.emit()
    writer.table(config, "", header=None)
    text = "\n".join(writer.lines).rstrip() + "\n"
    return text


def uncomment_examples(text: str) -> str:
    """The text with every example block uncommented (for tests, and for an operator's editor)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith(EXAMPLE_BEGIN):
            inside = True
            continue
        if line.startswith(EXAMPLE_END):
            inside = False
            continue
        if inside:
            line = line[2:] if line.startswith("# ") else line.removeprefix("#")
        out.append(line)
    return "\n".join(out) + "\n"


def write_output(text: str, output: str | None, *, force: bool, mode: int, program: str) -> int:
    """``init``'s output: to stdout (no ``output``, or ``-``), or to a file created with ``mode``.

    The file is written whole then renamed, so a daemon reading it never sees half a file; it is
    created with its mode (a node's file holding a join token: 0600), so it is never briefly
    readable by others; an existing file is replaced only with ``force``. Returns the exit code.
    """
    if not output or output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(output)
    if path.exists() and not force:
        print(f"{program}: {path} exists; pass --force to replace it", file=sys.stderr)
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    tmp.replace(path)
    print(f"wrote {path}", file=sys.stderr)
    return 0
