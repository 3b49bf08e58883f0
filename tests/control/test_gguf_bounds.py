"""The GGUF header reader is bounded (depth, counts, string lengths, total bytes) and refuses a
hostile header with HeaderRefused naming the field, never a RecursionError (issue 29 §6)."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.catalog import gguf
from llmgw_control.catalog.gguf import HeaderRefused, NotGguf, Truncated, read_metadata

U32, U64, STRING, ARRAY = 4, 10, 8, 9


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def header(*kvs: bytes, kv_count: int | None = None, tensors: int = 0) -> bytes:
    count = len(kvs) if kv_count is None else kv_count
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, count) + b"".join(kvs)


def kv(key: str, kind: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", kind) + payload


def u32(key: str, value: int) -> bytes:
    return kv(key, U32, struct.pack("<I", value))


def nested(depth: int) -> bytes:
    """An array holding an array holding ... ``depth`` arrays, the innermost empty."""
    return b"".join(struct.pack("<IQ", ARRAY, 1) for _ in range(depth - 1)) + struct.pack("<IQ", U32, 0)


GOOD = [
    u32("llama.block_count", 2),
    kv("general.architecture", STRING, s("llama")),
    kv("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 3) + s("a") + s("bc") + s("")),
    kv("tokenizer.ggml.scores", ARRAY, struct.pack("<IQ", 6, 2) + struct.pack("<ff", 0.5, 1.5)),
]


def test_a_plain_header_reads() -> None:
    assert read_metadata(header(*GOOD)) == {"llama.block_count": 2, "general.architecture": "llama"}


def test_the_real_tiny_model_reads(tiny_model: Any) -> None:
    metadata = read_metadata(tiny_model.read_bytes()[: gguf.MAX_HEADER_BYTES])
    assert isinstance(metadata["general.architecture"], str)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        # The example: arrays nested 3,000 deep (a RecursionError before).
        (header(kv("evil", ARRAY, nested(3000))), "metadata 'evil'"),
        (header(kv("evil", ARRAY, nested(gguf.MAX_ARRAY_DEPTH + 1))), "metadata 'evil'"),
        (header(kv_count=2**63), "metadata_kv_count"),
        (header(kv_count=gguf.MAX_KV_COUNT + 1), "metadata_kv_count"),
        (header(tensors=2**64 - 1), "tensor_count"),
        (header(kv("evil", ARRAY, struct.pack("<IQ", STRING, 2**62))), "metadata 'evil' item count"),
        (header(kv("evil", ARRAY, struct.pack("<IQ", U32, gguf.MAX_ARRAY_ITEMS + 1))), "metadata 'evil' item count"),
        (header(kv("evil", STRING, struct.pack("<Q", 2**63))), "metadata 'evil' length"),
        (
            header(kv("evil", ARRAY, struct.pack("<IQ", STRING, 1) + struct.pack("<Q", gguf.MAX_STRING_BYTES + 1))),
            "metadata 'evil' length",
        ),
        (header(struct.pack("<Q", gguf.MAX_KEY_BYTES + 1)), "metadata[0].key length"),
        (
            header(
                kv(
                    "evil",
                    ARRAY,
                    struct.pack("<IQ", ARRAY, gguf.MAX_NESTED_ARRAYS + 1)
                    + struct.pack("<IQ", U32, 0) * (gguf.MAX_NESTED_ARRAYS + 1),
                )
            ),
            "metadata 'evil'",
        ),
        # A key made to mess up a log line is quoted and cut.
        (header(kv("\x1b[2J" + "k" * 100, ARRAY, nested(50))), "metadata '\\x1b[2J" + "k" * 60 + "...'"),
    ],
)
def test_a_hostile_header_is_refused_naming_the_field(data: bytes, field: str) -> None:
    with pytest.raises(HeaderRefused) as refused:
        read_metadata(data)
    assert refused.value.field == field
    assert str(refused.value).startswith(field + ": ")


def test_a_header_that_runs_past_the_bound_is_refused() -> None:
    # The bytes read end inside one string of a header that goes on: past the 16 MiB bound.
    tokens = header(kv("t", ARRAY, struct.pack("<IQ", STRING, 2**20) + s("y" * 30) * 2**20))
    assert len(tokens) > gguf.MAX_HEADER_BYTES
    with pytest.raises(HeaderRefused) as refused:
        read_metadata(tokens)
    assert refused.value.field == "header"
    # A short read that ends early is only truncated: the file may simply be cut.
    with pytest.raises(Truncated):
        read_metadata(tokens[:1000])


def test_every_truncation_of_a_good_header_is_truncated() -> None:
    data = header(*GOOD)
    for end in range(len(data)):
        with pytest.raises((Truncated, NotGguf)):
            read_metadata(data[:end])


# GGUF values of every type, nested, with counts and lengths that may lie.
_scalar = st.sampled_from(
    [
        (0, "<B", 7),
        (4, "<I", 2**31),
        (5, "<i", -3),
        (6, "<f", 1.5),
        (7, "<?", True),
        (10, "<Q", 2**63),
        (11, "<q", -(2**40)),
        (12, "<d", 0.25),
    ]
)


@st.composite
def _value(draw: st.DrawFn, depth: int = 0) -> tuple[int, bytes]:
    choice = draw(st.integers(0, 3 if depth < 12 else 1))
    if choice == 0:
        kind, fmt, value = draw(_scalar)
        return kind, struct.pack(fmt, value)
    if choice == 1:
        return STRING, s(draw(st.binary(max_size=12)))
    if choice == 2:
        kind, fmt, value = draw(_scalar)
        count = draw(st.integers(0, 5))
        return ARRAY, struct.pack("<IQ", kind, count) + struct.pack(fmt, value) * count
    items = draw(st.lists(_value(depth + 1), max_size=3))
    item_kind = items[0][0] if items else STRING
    same = [payload for kind, payload in items if kind == item_kind]
    return ARRAY, struct.pack("<IQ", item_kind, len(same)) + b"".join(same)


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    entries = draw(st.lists(st.tuples(st.text(max_size=8), _value()), max_size=4))
    data = header(*(kv(key, kind, payload) for key, (kind, payload) in entries))
    # Then lie somewhere: overwrite 8 bytes with an absurd or random number, or cut it.
    edit = draw(st.integers(0, 2))
    if edit == 1 and len(data) > 32:
        at = draw(st.integers(4, len(data) - 8))
        number = draw(st.sampled_from([2**64 - 1, 2**63, 2**32, 3000, 0]) | st.integers(0, 2**64 - 1))
        data = data[:at] + struct.pack("<Q", number) + data[at + 8 :]
    elif edit == 2:
        data = data[: draw(st.integers(0, len(data)))]
    return data


@settings(max_examples=400, deadline=None)
@given(data=headers())
def test_any_header_reads_or_is_refused_cleanly(data: bytes) -> None:
    try:
        metadata = read_metadata(data)
    except (Truncated, NotGguf):
        return  # HeaderRefused is a NotGguf: every caller already handles it
    assert isinstance(metadata, dict)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300))
def test_any_bytes_after_the_magic_read_or_are_refused_cleanly(data: bytes) -> None:
    with contextlib.suppress(Truncated, NotGguf):
        read_metadata(b"GGUF" + data)
