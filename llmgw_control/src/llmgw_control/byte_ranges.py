"""Range requests (RFC 9110 section 14), parsed strictly, for every file a Quart app of ours sends.

Quart's own range handling (``send_file(..., conditional=True)``, which serves the node's
engine archives, weights and wheels and the dashboard's static files) trusted the numbers it was
given: ``Range: bytes=0-<40 digits>`` was answered with a 206 whose ``Content-Range`` claimed
bytes the file does not have, which h11 then refused to send (a 500 and a LocalProtocolError),
and it answered a malformed Range with 416 where RFC 9110 says to ignore it.

Here, one parser decides, and the answer is always one of three:

* **200**, the whole file: no Range, a unit other than ``bytes``, a header that does not parse, a
  range whose last byte precedes its first, or several ranges (a server MAY ignore Range, and
  multipart answers buy a node nothing but cost us: nodes resume with one open range);
* **206**, one range, its end clamped to the file;
* **416** with ``Content-Range: bytes */<size>`` when the one range cannot be satisfied (it starts
  at or past the end, or is a zero-length suffix).

``If-Range`` is honoured by exact match with the ETag or Last-Modified we send (RFC 9110
13.1.5); anything else means the whole file.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Any

from quart import Request, Response
from quart_trio.wrappers import TrioResponse

# Digits beyond this many (after leading zeros) are a number larger than any file: compared as
# "huge" instead of converted, since int() refuses 4,300+ digit strings with a ValueError.
_MAX_DIGITS = 18
_RANGE_SPEC = re.compile(r"([0-9]*)-([0-9]*)")


class Unsatisfiable(enum.Enum):
    """A single range that selects no byte of the file: answered 416."""

    RANGE = 0


UNSATISFIABLE = Unsatisfiable.RANGE


def _number(digits: str) -> int | None:
    """The value of a run of digits, or None when it is larger than any file could be."""
    significant = digits.lstrip("0")
    if len(significant) > _MAX_DIGITS:
        return None
    return int(significant or "0")


def _order(digits: str) -> tuple[int, str]:
    """Sorts runs of digits by their value, however many there are."""
    significant = digits.lstrip("0")
    return len(significant), significant


def byte_range(header: str, size: int) -> tuple[int, int] | Unsatisfiable | None:
    """The ``(start, stop)`` bytes (stop exclusive) a Range header selects from ``size`` bytes.

    None: ignore the header and send the whole file. UNSATISFIABLE: answer 416.
    """
    unit, equals, ranges = header.partition("=")
    if not equals or unit.strip().lower() != "bytes":
        return None
    specs = [spec.strip() for spec in ranges.split(",")]
    specs = [spec for spec in specs if spec]  # the #rule allows empty list elements
    if len(specs) != 1:
        return None
    match = _RANGE_SPEC.fullmatch(specs[0])
    if match is None:
        return None
    first_text, last_text = match.groups()
    if not first_text:
        if not last_text:
            return None  # "bytes=-" is not a range
        suffix = _number(last_text)
        if suffix == 0 or size == 0:
            return UNSATISFIABLE
        return (0 if suffix is None else max(0, size - suffix)), size
    if last_text and _order(last_text) < _order(first_text):
        return None  # last-pos before first-pos: an invalid range-spec, so the header is ignored
    first = _number(first_text)
    if first is None or first >= size:
        return UNSATISFIABLE
    last = _number(last_text) if last_text else None
    stop = size if last is None else min(last + 1, size)
    return first, stop


def _if_range_allows(request: Request, response: Response) -> bool:
    """RFC 9110 13.1.5: a Range with If-Range applies only if the validator matches exactly."""
    validator = request.headers.get("If-Range")
    if validator is None:
        return True
    validator = validator.strip()
    etag = response.headers.get("ETag")
    if validator.startswith(("W/", '"')):
        return etag is not None and not etag.startswith("W/") and validator == etag
    return validator == response.headers.get("Last-Modified")


class StrictRangeResponse(TrioResponse):
    """quart-trio's Response with :func:`byte_range` deciding every range request (``app.response_class``)."""

    async def make_conditional(
        self, request: Request, accept_ranges: bool | str = False, complete_length: int | None = None
    ) -> Response:
        # Quart's own logic for what is not about ranges (If-None-Match: 304, If-Match: 412); with no
        # length given it leaves the Range header alone (its range code needs one).
        await super().make_conditional(request, accept_ranges=False, complete_length=None)
        if not accept_ranges or complete_length is None or request.method not in ("GET", "HEAD"):
            return self
        self.headers["Accept-Ranges"] = "bytes"
        header = request.headers.get("Range")
        if self.status_code != 200 or header is None or not _if_range_allows(request, self):
            return self
        selected = byte_range(header, complete_length)
        if selected is None:
            return self
        if selected is UNSATISFIABLE:
            self._unsatisfiable(complete_length)
            return self
        start, stop = selected
        body: Any = self.response
        try:
            await body.make_conditional(start, stop)
        except AttributeError:  # a body kind without ranges: buffered first, as Quart does
            await self.make_sequence()
            await self.response.make_conditional(start, stop)  # type: ignore[attr-defined]
        self.status_code = 206
        self.content_length = stop - start
        self.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{complete_length}"
        return self

    def _unsatisfiable(self, size: int) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": f"The range cannot be satisfied: the file is {size} bytes.",
                    "code": "range_not_satisfiable",
                    "field": "Range",
                }
            }
        ).encode()
        self.status_code = 416
        self.set_data(body)
        self.mimetype = "application/json"
        self.headers["Content-Range"] = f"bytes */{size}"
        for name in ("ETag", "Last-Modified"):
            self.headers.pop(name, None)


__all__ = ["UNSATISFIABLE", "StrictRangeResponse", "Unsatisfiable", "byte_range"]
