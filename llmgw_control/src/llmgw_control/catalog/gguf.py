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
MIB = 1024 * 1024


class Truncated(Exception):
    """The bytes ended before the metadata did."""


class NotGguf(ValueError):
    pass


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise Truncated()
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += size
        return value

    def string(self) -> str:
        length = self.take("<Q")
        if self.at + length > len(self.data):
            raise Truncated()
        text = self.data[self.at:self.at + length].decode("utf-8", "replace")
        self.at += length
        return text

    def value(self, kind: int, keep: bool) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.take("<I"), self.take("<Q")
            if item_kind in _SCALARS and not keep:
                # Skip fixed-size arrays (token scores, types) without decoding them.
                self.at += struct.calcsize(_SCALARS[item_kind]) * count
                if self.at > len(self.data):
                    raise Truncated()
                return None
            items = [self.value(item_kind, keep) for _ in range(count)]
            return items if keep else None
        raise NotGguf(f"unknown metadata value type {kind}")


def read_metadata(data: bytes) -> dict[str, Any]:
    """Scalar metadata of a GGUF file from its first bytes; raises Truncated if they are too few."""
    reader = _Reader(data)
    if data[:4] != b"GGUF":
        raise NotGguf("not a GGUF file (bad magic)")
    reader.at = 4
    version = reader.take("<I")
    if version < 2:
        raise NotGguf(f"GGUF version {version} is too old")
    reader.take("<Q")  # tensor count
    kv_count = reader.take("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = reader.string()
        kind = reader.take("<I")
        value = reader.value(kind, keep=False)
        if value is not None:
            metadata[key] = value
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
