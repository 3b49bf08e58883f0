"""The one JSON parser for network input: depth bounded, whatever the caller's stack, and only ValueError."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_shared.jsonin import MAX_DEPTH, JsonTooDeep, loads, nesting_exceeds

# Strings full of what the depth reading must see through: brackets, quotes, backslashes.
TRICKY = st.text(alphabet=st.sampled_from('[]{}"\\ab\n\u00e9\\"'), max_size=8) | st.text(max_size=8)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TRICKY
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=4), max_leaves=60
)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def nested(levels: int, kinds: str = "[{") -> str:
    opening = "".join(("[" if kinds[i % len(kinds)] == "[" else '{"a":') for i in range(levels))
    closing = "".join(("]" if kinds[i % len(kinds)] == "[" else "}") for i in reversed(range(levels)))
    return opening + "1" + closing


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 999, 1000, 5000, 100_000])
@pytest.mark.parametrize("kinds", ["[", "{", "[{"])
def test_deeper_than_the_limit_is_refused_as_a_value_error(levels: int, kinds: str) -> None:
    text = nested(levels, kinds)
    for data in (text, text.encode()):
        with pytest.raises(JsonTooDeep, match=f"deeper than {MAX_DEPTH}"):
            loads(data)


@pytest.mark.parametrize("kinds", ["[", "{", "[{"])
def test_the_limit_itself_is_accepted(kinds: str) -> None:
    assert depth(loads(nested(MAX_DEPTH, kinds))) == MAX_DEPTH
    assert depth(loads(nested(MAX_DEPTH, kinds).encode())) == MAX_DEPTH


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    # The cheap bracket count is only a bound: it sends this to the walk, which finds depth 1.
    value = {"content": "[" * 10_000 + "{" * 10_000}
    assert loads(json.dumps(value)) == value


def test_the_bound_holds_however_deep_the_caller_already_is() -> None:
    # Near the interpreter's recursion limit, json alone would refuse far shallower documents with
    # a RecursionError; the bound is ours, and the refusal is still JsonTooDeep.
    def at_depth(n: int) -> Any:
        return at_depth(n - 1) if n else loads(nested(MAX_DEPTH + 1))

    with pytest.raises(JsonTooDeep):
        at_depth(700)


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"t": -Infinity}'])
def test_python_only_constants_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        loads(text)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_what_json_writes_within_the_limit_reads_back(value: Any) -> None:
    text = json.dumps(value)
    assert loads(text) == value
    assert loads(text.encode()) == value


@pytest.mark.slow  # left out of the quick tier: hypothesis over deep documents
@settings(max_examples=500, deadline=None)
@given(VALUES, st.booleans(), st.booleans(), st.integers(min_value=0, max_value=12))
def test_the_depth_read_from_the_text_is_the_depth_of_the_value(
    value: Any, ascii: bool, spaced: bool, wrap: int
) -> None:
    for _ in range(wrap):  # deeper than the rounds of pruning, so the one-pass reading is tested too
        value = [value, {"k": "]"}]
    text = json.dumps(value, ensure_ascii=ascii, indent=1 if spaced else None).encode()
    levels = depth(value)
    assert nesting_exceeds(text, levels) is False
    if levels:
        assert nesting_exceeds(text, levels - 1) is True


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(alphabet='[]{}":,0 tnulfa\\', max_size=300).map(str.encode))
def test_any_bytes_give_a_value_or_a_value_error(data: bytes) -> None:
    try:
        value = loads(data)
    except ValueError:
        return
    assert depth(value) <= MAX_DEPTH
    assert not (isinstance(value, float) and math.isnan(value))
