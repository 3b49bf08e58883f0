"""One logging setup for both daemons.

Lines are structured: JSON objects when stderr is not a terminal (journald, files, collectors),
``key=value`` text when a person is watching. Every line logged while a request is being served
carries that request's id, taken from a context variable, so a request can be followed across
the gateway, the upstream client and the metrics without passing ids around by hand.

Secrets must never reach a log: API keys, join tokens and Authorization headers are scrubbed
from every message and field by a filter on the handler, so a careless ``log.info(headers)``
cannot leak one.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("llmgw_request_id", default=None)

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is a field.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

_SECRET_PATTERNS = [
    # Authorization: Bearer <anything>
    (re.compile(r"(?i)(bearer\s+)[^\s'\",;]+"), r"\1[redacted]"),
    # our own key and token formats
    (re.compile(r"\b(sk-llmgw-|llmgw-join-)[A-Za-z0-9_\-]+"), r"\1[redacted]"),
    # key=value / "key": "value" forms for the usual secret names
    (
        re.compile(
            r"(?i)([\"']?(?:api[_-]?key|authorization|token|join[_-]?token|password|secret)[\"']?\s*[:=]\s*[\"']?)"
            r"[^\s'\",;}]+"
        ),
        r"\1[redacted]",
    ),
]


# Every pattern above needs one of these words: one search rules out the common case (no secret)
# at a fraction of the cost of three substitutions, on every field of every access line.
_MAYBE_SECRET = re.compile(r"(?i)bearer|sk-llmgw-|llmgw-join-|key|authorization|token|password|secret")


def redact(text: str) -> str:
    if _MAYBE_SECRET.search(text) is None:
        return text
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


_SECRET_FIELD = re.compile(r"(?i)^(.*[_-])?(api[_-]?key|key|authorization|token|password|secret)$")


_secret_field_names: dict[str, bool] = {}


def _is_secret_field(name: str) -> bool:
    known = _secret_field_names.get(name)
    if known is None:
        known = _secret_field_names[name] = _SECRET_FIELD.fullmatch(name) is not None
    return known


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """Extra fields of a record; a field named like a secret is dropped whatever its value looks like."""
    return {
        k: "[redacted]" if _is_secret_field(k) else v
        for k, v in vars(record).items()
        if k not in _STANDARD_ATTRS and not k.startswith("_")
    }


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            rid = request_id_var.get()
            if rid is not None:
                record.request_id = rid
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key, value in _fields(record).items():
            entry[key] = redact(value) if isinstance(value, str) else value
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        parts = [stamp, f"{record.levelname.lower():<7}", record.name, redact(record.getMessage())]
        for key, value in _fields(record).items():
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            parts.append(f"{key}={redact(text)}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + redact(self.formatException(record.exc_info))
        return line


def setup_logging(level: str | int = "info", *, json_lines: bool | None = None, stream: Any = None) -> None:
    """Configure the root logger once per process; ``json_lines=None`` picks by whether stderr is a tty."""
    stream = stream if stream is not None else sys.stderr
    if json_lines is None:
        json_lines = not (hasattr(stream, "isatty") and stream.isatty())
    # Neither formatter prints the caller's file and line, thread or process, and collecting them
    # (a frame walk and a getpid() per record) was a third of an access line's cost. These are
    # the switches the logging documentation gives for it (its "Optimization" section).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    handler.addFilter(_ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # Libraries log every connection and request at INFO; our own lines say what matters.
    for noisy in ("hypercorn.access", "hypercorn.error", "httpx2", "httpcore2", "trio-websocket", "quart.serving"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("llmgw") else f"llmgw.{name}")


@contextmanager
def request_context(request_id: str) -> Iterator[None]:
    token = request_id_var.set(request_id)
    try:
        yield
    finally:
        request_id_var.reset(token)
