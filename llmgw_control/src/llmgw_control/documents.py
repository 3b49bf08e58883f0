"""The one converter of JSON documents that come from outside: admin API bodies and query values,
and the model definitions the store keeps (written through that API, read back at every start).

Strict as the config loader's (``llmgw_shared.config.strict_converter``: unknown fields and wrong
types refused, never coerced), plus what a document from the network needs beyond a config file:
strings a database and an encoder accept, and one parser of every date-time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import cattrs

from llmgw_shared.config import strict_converter


def clean_str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    # NUL is refused by PostgreSQL and a lone surrogate by every encoder: say so here, as a 400,
    # instead of failing in the driver.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (a lone surrogate)") from None
    return value


def datetime_in(value: Any, _: type) -> datetime:
    """An RFC 3339 date-time, as a UTC datetime: the one parser of every date-time the API takes.

    Its instant must be one Python can hold in UTC: ``9999-12-31T23:59:59-14:00`` is valid RFC
    3339, but its UTC instant is in the year 10000, and converting it raised OverflowError (a 500)
    wherever it was first compared or stored. Converted here, once, it is a 400 naming the field.
    """
    if not isinstance(value, str):
        raise TypeError(f"expected an RFC 3339 date-time string, got {type(value).__name__}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value[:64]!r} is not an RFC 3339 date-time (e.g. 2026-12-02T10:00:00Z)") from None
    if parsed.tzinfo is None:
        raise ValueError("needs a timezone (e.g. Z or +01:00)")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"{value[:64]!r} is out of range: in UTC it must lie between 0001-01-01T00:00:00Z and "
            "9999-12-31T23:59:59.999999Z"
        ) from None


def make_converter() -> cattrs.Converter:
    converter = strict_converter()
    # strict_converter already refuses a string where a list belongs ("tiny" -> ["t","i",...]).
    converter.register_structure_hook(str, clean_str)
    converter.register_structure_hook(datetime, datetime_in)
    converter.register_unstructure_hook(datetime, lambda d: d.astimezone(UTC).isoformat().replace("+00:00", "Z"))
    return converter


CONVERTER = make_converter()
