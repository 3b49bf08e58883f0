"""Reading just enough of a GGUF header to estimate the memory a model needs.

Placement must know whether a model fits before any node downloads it. The weights' size is
known from the catalog; the KV cache depends on the architecture (layers, KV heads, head size)
and the context, which only the GGUF metadata says. The metadata sits at the start of the file,
so a ranged read of its first megabytes is enough, on the control side, without the weights.
"""

from __future__ import annotations

import struct
from typing import Any

import attrs

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
MIB = 1024 * 1024

# Bounds on a header, each far above what any GGUF writer emits, so that one made to hurt is
# refused (HeaderRefused, naming the field) rather than read: arrays nested thousands deep would
# exhaust Python's stack, and absurd counts or lengths would be walked for as long as the bytes last.
# Every metadata array of llama.cpp's writers is flat (a list of scalars or of strings).
MAX_ARRAY_DEPTH = 8
# Metadata keys: a model carries about 30 to 60.
MAX_KV_COUNT = 65_536
# Tensors: a large mixture-of-experts model has a few thousand.
MAX_TENSOR_COUNT = 1_048_576
# Items of one array: the largest vocabularies (tokens, their scores, merges) are about 262,144.
MAX_ARRAY_ITEMS = 16_777_216
# Arrays held in other arrays, in all: no writer we know emits one, and each costs a few
# microseconds to walk (string items are skipped by a tight loop, fixed-size ones unread).
MAX_NESTED_ARRAYS = 65_536
# A key (the GGUF specification's own limit: 65,535 bytes).
MAX_KEY_BYTES = 65_535
# A string value: a chat template is tens of KiB.
MAX_STRING_BYTES = 4 * MIB
# The header read at all: its metadata (with the tokenizer) is a few MiB in every model we know.
MAX_HEADER_BYTES = 16 * MIB


class Truncated(Exception):
    """The bytes ended before the metadata did."""


class NotGguf(ValueError):
    pass


class HeaderRefused(NotGguf):
    """A header past one of the bounds above: made to hurt, or broken. ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _key_words(key: str) -> str:
    # Keys come from the file: shown quoted and cut, whatever they hold.
    return repr(key[:64] + ("..." if len(key) > 64 else ""))


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0
        self.nested = 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise Truncated()
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += size
        return value

    def count(self, field: str, bound: int) -> int:
        value: int = self.take("<Q")
        if value > bound:
            raise HeaderRefused(field, f"{value} is more than {bound}")
        return value

    def string(self, field: str, bound: int) -> str:
        length = self.count(f"{field} length", bound)
        if self.at + length > len(self.data):
            raise Truncated()
        text = self.data[self.at : self.at + length].decode("utf-8", "replace")
        self.at += length
        return text

    def skip_strings(self, count: int, field: str) -> None:
        """Step over ``count`` strings (a vocabulary's tokens, its merges) without decoding them:
        the loop a tokenizer's 262,144 tokens take, kept tight."""
        data, at, end = self.data, self.at, len(self.data)
        for _ in range(count):
            if at + 8 > end:
                raise Truncated()
            (length,) = _U64.unpack_from(data, at)
            if length > MAX_STRING_BYTES:
                raise HeaderRefused(f"{field} length", f"{length} is more than {MAX_STRING_BYTES}")
            at += 8 + length
        if at > end:
            raise Truncated()
        self.at = at

    def value(self, kind: int, keep: bool, field: str, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string(field, MAX_STRING_BYTES)
        if kind == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise HeaderRefused(field, f"arrays nested more than {MAX_ARRAY_DEPTH} deep")
            item_kind, count = self.take("<I"), self.count(f"{field} item count", MAX_ARRAY_ITEMS)
            if item_kind in _SCALARS and not keep:
                # Skip fixed-size arrays (token scores, types) without decoding them.
                self.at += struct.calcsize(_SCALARS[item_kind]) * count
                if self.at > len(self.data):
                    raise Truncated()
                return None
            if item_kind == _STRING and not keep:
                self.skip_strings(count, field)
                return None
            if item_kind == _ARRAY:
                self.nested += count
                if self.nested > MAX_NESTED_ARRAYS:
                    raise HeaderRefused(field, f"more than {MAX_NESTED_ARRAYS} arrays within arrays")
            items = [self.value(item_kind, keep, field, depth + 1) for _ in range(count)]
            return items if keep else None
        raise NotGguf(f"unknown metadata value type {kind}")


def read_metadata(data: bytes) -> dict[str, Any]:
    """Scalar metadata of a GGUF file from its first bytes (at most MAX_HEADER_BYTES are read).

    Raises Truncated if they are too few, NotGguf if they are not a GGUF header, and
    HeaderRefused (a NotGguf) naming the field that is past its bound.
    """
    data = data[:MAX_HEADER_BYTES]
    reader = _Reader(data)
    if data[:4] != b"GGUF":
        raise NotGguf("not a GGUF file (bad magic)")
    reader.at = 4
    version = reader.take("<I")
    if version < 2:
        raise NotGguf(f"GGUF version {version} is too old")
    reader.count("tensor_count", MAX_TENSOR_COUNT)
    kv_count = reader.count("metadata_kv_count", MAX_KV_COUNT)
    metadata: dict[str, Any] = {}
    try:
        for index in range(kv_count):
            key = reader.string(f"metadata[{index}].key", MAX_KEY_BYTES)
            kind = reader.take("<I")
            value = reader.value(kind, False, f"metadata {_key_words(key)}")
            if value is not None:
                metadata[key] = value
    except Truncated:
        if len(data) >= MAX_HEADER_BYTES:
            # The file goes on, its metadata past the bound: not a shorter read's fault.
            raise HeaderRefused("header", f"its metadata runs past {MAX_HEADER_BYTES} bytes") from None
        raise
    return metadata


@attrs.frozen
class MemoryEstimate:
    ram_mib: int
    how: str


def estimate_ram(metadata: dict[str, Any] | None, *, weights_bytes: int, context: int) -> MemoryEstimate:
    """Weights + KV cache (f16 K and V for every layer) + a compute buffer."""
    overhead = max(64 * MIB, weights_bytes // 20)
    if metadata:
        arch = metadata.get("general.architecture")
        layers = metadata.get(f"{arch}.block_count")
        embd = metadata.get(f"{arch}.embedding_length")
        heads = metadata.get(f"{arch}.attention.head_count")
        kv_heads = metadata.get(f"{arch}.attention.head_count_kv", heads)
        if isinstance(layers, int) and isinstance(embd, int) and isinstance(heads, int) and heads:
            head_dim = metadata.get(f"{arch}.attention.key_length") or embd // heads
            kv_bytes = 2 * layers * int(kv_heads or heads) * int(head_dim) * 2 * context
            total = weights_bytes + kv_bytes + overhead
            return MemoryEstimate(-(-total // MIB), f"GGUF {arch}: {layers} layers, KV cache for {context} tokens")
    # Without metadata: the weights plus a generous margin.
    total = weights_bytes + weights_bytes // 5 + 256 * MIB
    return MemoryEstimate(-(-total // MIB), "weights size + 20% + 256 MiB (no GGUF metadata)")
