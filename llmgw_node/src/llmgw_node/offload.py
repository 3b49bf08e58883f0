"""Did a GPU replica's engine put its layers on the GPU? Read back from llama.cpp's load log.

llama.cpp logs ``load_tensors: offloaded N/M layers to GPU`` (src/llama-model.cpp) when a GPU
backend is loaded, and nothing of the kind when none is: a GPU build whose plugin failed to load
runs on the CPU and says so only there. A replica placed on GPUs with no layers offloaded is
failed, not published: it would serve a GPU profile at CPU speed with nothing saying so.
"""

from __future__ import annotations

import re
from pathlib import Path

_OFFLOADED = re.compile(rb"offloaded (\d{1,6})/(\d{1,6}) layers to GPU")
# The load lines come within the first few hundred lines of a start; the tail of the log is what
# the current run wrote (a restart appends), and this bounds what is read of a noisy one.
MAX_READ = 4 << 20


def offloaded_layers(log: bytes) -> tuple[int, int] | None:
    """(offloaded, total) from the last load in ``log``; None when it logged no offload at all."""
    found = _OFFLOADED.findall(log)
    if not found:
        return None
    done, total = found[-1]
    return int(done), int(total)


def read_tail(path: Path, limit: int = MAX_READ) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read(limit)
    except OSError:
        return b""


def offload_problem(log: bytes, devices: list[int]) -> str:
    """Why a replica started on ``devices`` is not on them ("" when its layers are offloaded)."""
    layers = offloaded_layers(log)
    if layers is None:
        return (
            f"placed on GPU(s) {', '.join(map(str, devices))} but the engine offloaded nothing: its log has no "
            "'offloaded N/M layers to GPU' line, so no GPU backend loaded and it runs on the CPU"
        )
    if layers[0] == 0:
        return (
            f"placed on GPU(s) {', '.join(map(str, devices))} but the engine offloaded 0/{layers[1]} layers "
            "to GPU: it runs on the CPU"
        )
    return ""
