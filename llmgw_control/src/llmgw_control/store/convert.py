"""Conversions and input checks shared by every query module.

Checks live here, before any SQL runs, so that bad input is refused with the field's name
and identically on both backends (the databases' own messages differ).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from ..priority import PRIORITY_NAMES
from .errors import InvalidInput

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The longest name the store takes (groups, keys, models): more than any label an operator types,
# and short enough to show in a table or a log line whole.
MAX_NAME = 200


class Unset(enum.Enum):
    """Marks an update argument the caller did not pass (None is a meaningful value)."""

    UNSET = 0


UNSET: Literal[Unset.UNSET] = Unset.UNSET


def to_us(field: str, value: datetime) -> int:
    if not isinstance(value, datetime):
        raise InvalidInput(field, "must be a datetime")
    if value.tzinfo is None:
        raise InvalidInput(field, "must be timezone-aware (UTC)")
    # timedelta arithmetic is exact, unlike timestamp() which goes through a float.
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def opt_to_us(field: str, value: datetime | None) -> int | None:
    return None if value is None else to_us(field, value)


def from_us(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(value))


def opt_from_us(value: int | None) -> datetime | None:
    return None if value is None else from_us(value)


def priority(field: str, value: object) -> str | None:
    """A group's priority class, or None (inherit)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in PRIORITY_NAMES:
        raise InvalidInput(field, f"must be one of {', '.join(PRIORITY_NAMES)}, or null to inherit the parent's")
    return value


def name(field: str, value: object, *, max_len: int = MAX_NAME) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, "must be a non-empty string")
    if len(value) > max_len:
        raise InvalidInput(field, f"must be at most {max_len} characters")
    if value != value.strip():
        raise InvalidInput(field, "must not start or end with whitespace")
    return value


def text(field: str, value: object, *, max_len: int = 1000) -> str:
    """A string that may be empty (e.g. a usage row's key id for an open gateway)."""
    if not isinstance(value, str):
        raise InvalidInput(field, "must be a string")
    if len(value) > max_len:
        raise InvalidInput(field, f"must be at most {max_len} characters")
    return value


def count(field: str, value: object, *, minimum: int = 0) -> int:
    # bool is an int subclass; True as a token count is a caller bug, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(field, "must be an integer")
    if value < minimum:
        raise InvalidInput(field, f"must be at least {minimum}")
    if value > 2**62:
        raise InvalidInput(field, "is too large")
    return value


def opt_count(field: str, value: object) -> int | None:
    return None if value is None else count(field, value)


def number(field: str, value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidInput(field, "must be a finite number")
    if value < 0:
        raise InvalidInput(field, "must not be negative")
    return float(value)


def flag(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(field, "must be true or false")
    return value


def json_object(field: str, value: object) -> str:
    """Serialise a JSON object (a mapping with string keys) or refuse it naming the field."""
    if not isinstance(value, Mapping):
        raise InvalidInput(field, "must be a JSON object")
    try:
        return json.dumps(dict(value), allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(field, f"is not valid JSON: {exc}") from None


def labels(field: str, value: object) -> str:
    if not isinstance(value, Mapping):
        raise InvalidInput(field, "must be a mapping of strings to strings")
    for k, v in value.items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise InvalidInput(field, "must be a mapping of non-empty strings to strings")
    return json.dumps(dict(sorted(value.items())), separators=(",", ":"))


def model_list(field: str, value: object) -> str | None:
    """None (every model) or a list of model names, stored as a JSON array."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidInput(field, "must be a list of model names or null")
    names = [name(f"{field}[{i}]", v) for i, v in enumerate(value)]
    if len(set(names)) != len(names):
        raise InvalidInput(field, "lists a model twice")
    return json.dumps(names, separators=(",", ":"))


def load_json(value: str) -> Any:
    return json.loads(value)


def load_models(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(json.loads(value))
