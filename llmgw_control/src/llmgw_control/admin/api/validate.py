"""Admin API input, structured strictly and checked against the fields' constraints before any
handler runs, so nothing is written for a request that breaks one; a failure is a 400 naming the
first field at fault (``profiles[0].context``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs
from cattrs.errors import ForbiddenExtraKeysError

from ...api_errors import bad_request
from ...documents import CONVERTER

# The store keeps integers as BIGINT; anything larger is refused here rather than by a driver.
MAX_INT = 2**62


def _path_text(path: str) -> str:
    """cattrs' ``$.profiles[0].weights`` as ``profiles[0].weights``."""
    return path.removeprefix("$").removeprefix(".")


def _first_problem(exc: BaseException, path: str = "$") -> tuple[str, str]:
    """The first leaf failure of a cattrs error tree as (field, message)."""
    if isinstance(exc, ForbiddenExtraKeysError):
        unknown = sorted(exc.extra_fields)[0]
        known = sorted(a.name for a in attrs.fields(exc.cl)) if attrs.has(exc.cl) else []
        field = f"{_path_text(path)}.{unknown}".lstrip(".")
        return field, f"unknown field (known: {', '.join(known)})"
    if isinstance(exc, cattrs.BaseValidationError):
        for sub in exc.exceptions:
            note = next((n for n in getattr(sub, "__notes__", []) if hasattr(n, "name") or hasattr(n, "index")), None)
            if note is not None and hasattr(note, "name"):
                sub_path = f"{path}.{note.name}"
            elif note is not None and isinstance(note.index, str):
                sub_path = f"{path}.{note.index}"  # a mapping's key: env.HOME, labels.zone
            elif note is not None:
                sub_path = f"{path}[{note.index!r}]"
            else:
                sub_path = path
            return _first_problem(sub, sub_path)
        return _path_text(path) or "(body)", str(exc)
    if isinstance(exc, KeyError):
        return _path_text(path) or "(body)", "required field missing"
    return _path_text(path) or "(body)", str(exc) or type(exc).__name__


def _check_constraints(value: Any, cls: type, path: str) -> None:
    """The ``schema`` metadata of each field, enforced on a structured value."""
    for field in attrs.fields(cls):
        item = getattr(value, field.name)
        where = f"{path}.{field.name}" if path else field.name
        _check_value(item, field.metadata.get("schema", {}), where)
        if attrs.has(type(item)):
            _check_constraints(item, type(item), where)
        elif isinstance(item, list):
            for i, element in enumerate(item):
                if attrs.has(type(element)):
                    _check_constraints(element, type(element), f"{where}[{i}]")


def _check_value(item: Any, rules: Mapping[str, Any], where: str) -> None:
    if item is None:
        return
    if isinstance(item, int | float) and not isinstance(item, bool):
        if isinstance(item, int) and abs(item) > MAX_INT:
            raise bad_request(where, "is too large")
        if (isinstance(item, float) and item != item) or item in (float("inf"), float("-inf")):
            raise bad_request(where, "must be a finite number")
        if "minimum" in rules and item < rules["minimum"]:
            raise bad_request(where, f"must be at least {rules['minimum']}")
        if "maximum" in rules and item > rules["maximum"]:
            raise bad_request(where, f"must be at most {rules['maximum']}")
    if isinstance(item, str):
        if "minLength" in rules and len(item) < rules["minLength"]:
            raise bad_request(
                where,
                "must not be empty" if rules["minLength"] == 1 else f"must be at least {rules['minLength']} characters",
            )
        if "maxLength" in rules and len(item) > rules["maxLength"]:
            raise bad_request(where, f"must be at most {rules['maxLength']} characters")
        # Schema patterns are written anchored (^...$) and matched whole: re.search with "$" would
        # also accept the value with a newline after it.
        if "pattern" in rules and not re.fullmatch(rules["pattern"], item):
            raise bad_request(where, rules.get("x-pattern-message", f"must match {rules['pattern']}"))
    if isinstance(item, list | dict):
        if "maxItems" in rules and len(item) > rules["maxItems"]:
            raise bad_request(where, f"must have at most {rules['maxItems']} items")
        if "maxProperties" in rules and len(item) > rules["maxProperties"]:
            raise bad_request(where, f"must have at most {rules['maxProperties']} entries")
    if isinstance(item, list) and "items" in rules:
        for i, element in enumerate(item):
            _check_value(element, rules["items"], f"{where}[{i}]")
    if isinstance(item, dict) and "additionalProperties" in rules:
        for key, element in item.items():
            _check_value(key, rules.get("propertyNames", {}), f"{where}.{key}")
            _check_value(element, rules["additionalProperties"], f"{where}.{key}")


def structure_body(data: Any, cls: type[Any]) -> Any:
    """``data`` (parsed JSON) as ``cls``, or a 400 naming the first field at fault."""
    if not isinstance(data, dict):
        raise bad_request(None, "the body must be a JSON object")
    try:
        value = CONVERTER.structure(data, cls)
    except (cattrs.BaseValidationError, ForbiddenExtraKeysError, KeyError, TypeError, ValueError) as exc:
        field, message = _first_problem(exc)
        raise bad_request(field, message) from None
    _check_constraints(value, cls, "")
    return value
