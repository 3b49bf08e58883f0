"""Loading TOML configuration into attrs classes, strictly.

cattrs on its own is lenient in ways that hide operator mistakes: it turns ``3`` into ``"3"``,
``2.5`` into ``2`` and ``true`` into ``1``, and ignores keys it does not know, so a misspelt
option silently keeps its default. A daemon that starts with a config it misread is worse than
one that refuses to start, so both daemons load their files through this module: unknown keys
and wrong types are refused with a message that names the key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar, get_origin

import attrs
import cattrs
from cattrs import BaseConverter
from cattrs.cols import list_structure_factory, mapping_structure_factory
from cattrs.dispatch import StructureHook
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.preconf.tomllib import make_converter

T = TypeVar("T")


class ConfigError(Exception):
    """A configuration that cannot be used; the message is meant for the operator as is."""


def _type_name(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _strict_str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {_type_name(value)} ({value!r})")
    return value


def _strict_int(value: Any, _: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {_type_name(value)} ({value!r})")
    return value


def _strict_float(value: Any, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {_type_name(value)} ({value!r})")
    return float(value)


def _strict_bool(value: Any, _: type) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {_type_name(value)} ({value!r})")
    return value


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def strict_collections(conv: cattrs.Converter) -> None:
    """Refuse a string where a list belongs (cattrs would split it into characters) and a
    non-object where a mapping belongs."""

    def list_factory(type_: Any, conv: BaseConverter) -> StructureHook:
        inner = list_structure_factory(type_, conv)

        def hook(value: Any, t: Any) -> Any:
            if not isinstance(value, list):
                raise TypeError(f"expected a list, got {json_kind(value)}")
            return inner(value, t)

        return hook

    def mapping_factory(type_: Any, conv: BaseConverter) -> StructureHook:
        inner = mapping_structure_factory(type_, conv)

        def hook(value: Any, t: Any) -> Any:
            if not isinstance(value, dict):
                raise TypeError(f"expected an object, got {json_kind(value)}")
            return inner(value, t)

        return hook

    def is_list(t: Any) -> bool:
        return get_origin(t) is list

    def is_dict(t: Any) -> bool:
        return get_origin(t) is dict

    conv.register_structure_hook_factory(is_list, list_factory)
    conv.register_structure_hook_factory(is_dict, mapping_factory)


def strict_converter(*, forbid_extra_keys: bool = True) -> cattrs.Converter:
    """A converter that refuses unknown keys and never coerces between primitive types."""
    converter = make_converter(forbid_extra_keys=forbid_extra_keys)
    converter.register_structure_hook(str, _strict_str)
    converter.register_structure_hook(int, _strict_int)
    converter.register_structure_hook(float, _strict_float)
    converter.register_structure_hook(bool, _strict_bool)
    strict_collections(converter)
    return converter


def _describe(exc: BaseException, _type: Any) -> str:
    if isinstance(exc, ForbiddenExtraKeysError):
        known = sorted(a.name for a in attrs.fields(exc.cl)) if attrs.has(exc.cl) else []
        unknown = ", ".join(repr(k) for k in sorted(exc.extra_fields))
        return f"unknown key {unknown} (known keys: {', '.join(known)})"
    if isinstance(exc, KeyError):
        return "required key missing"
    if isinstance(exc, TypeError | ValueError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def validation_messages(exc: BaseException) -> list[str]:
    """Render a cattrs structuring failure as ``path: problem`` lines, paths in dotted form."""
    lines = cattrs.transform_error(exc, path="$", format_exception=_describe)
    rendered = []
    for line in lines:
        message, _, path = line.rpartition(" @ ")
        where = path.removeprefix("$").removeprefix(".") or "(top level)"
        rendered.append(f"{where}: {message}")
    return rendered


def structure(data: Any, cls: type[T], converter: cattrs.Converter, *, source: str) -> T:
    """Structure ``data`` into ``cls`` or raise ConfigError naming ``source`` and every bad key."""
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, ForbiddenExtraKeysError, KeyError, TypeError, ValueError) as exc:
        problems = validation_messages(exc) if isinstance(exc, cattrs.BaseValidationError) else [str(exc)]
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None


def load_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def parse_host_port(text: str, *, what: str = "address") -> tuple[str, int]:
    """``host:port`` or ``[v6]:port``; a port alone or a missing host is refused, never guessed."""
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ConfigError(f"{what} {text!r}: expected [ipv6]:port")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ConfigError(f"{what} {text!r}: expected host:port, e.g. 127.0.0.1:8080")
        if ":" in host:
            raise ConfigError(f"{what} {text!r}: write an IPv6 address in brackets, e.g. [::1]:8080")
    if not host:
        raise ConfigError(f"{what} {text!r}: the host is missing (use 0.0.0.0 to listen on all addresses)")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{what} {text!r}: the port must be a number from 0 to 65535")
    return host, int(port_text)
