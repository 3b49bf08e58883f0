"""Engine processes at the OS level: identity in /proc, process-group signals, the state file.

An engine runs in its own session (so its process group holds it and anything it forks), writes
its output to a log file (a pipe would break it with SIGPIPE the moment the daemon restarts),
and is recorded in a state file with its pid and start time so the next daemon finds it again.
A pid alone is not an identity (pids are reused): the start time from ``/proc/<pid>/stat`` is
checked too, and a process is only ever signalled when both match.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import attrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from llmgw_shared.wire import ReplicaSpec, converter, v1_key

# An engine's log is rotated (one old file kept) past this size: llama-server logs a few lines a
# request, so 8 MiB holds hours of context for a failure, and a chatty engine cannot fill the disk.
LOG_KEEP_BYTES = 8 << 20


def start_ticks(pid: int, proc_root: str = "/proc") -> int | None:
    """The process's start time in clock ticks since boot, or None when there is no such process."""
    try:
        text = Path(f"{proc_root}/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces and parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    state = fields[0]
    if state in ("Z", "X"):
        return None
    return int(fields[19])


def alive(pid: int, ticks: int) -> bool:
    return ticks > 0 and start_ticks(pid) == ticks


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


@attrs.frozen
class ProcessRecord:
    replica_id: str
    pid: int
    ticks: int
    binary: str
    weights: str
    log: str
    spec: ReplicaSpec
    restarts: int = 0
    # llama.cpp: the adapters on the engine's command line (the spec's that were verified) and why
    # the others are not; None: all of the spec's (a record of a release that refused none).
    adapters: list[str] | None = None
    adapter_problem: str = ""


# The file a daemon of an earlier release wrote says "shard_id" (like the v1 wire): kept, so an
# upgraded daemon adopts what its predecessor recorded.
# The adapter fields are written only when set, so a record without them reads as before.
_STORED: dict[str, Any] = {
    "replica_id": override(rename=v1_key("replica_id")),
    "adapters": override(omit_if_default=True),
    "adapter_problem": override(omit_if_default=True),
}
_structure_record = make_dict_structure_fn(ProcessRecord, converter, **_STORED)
_unstructure_record = make_dict_unstructure_fn(ProcessRecord, converter, **_STORED)


class StateFile:
    """``<data_dir>/shards.json``: the engines this node started, for adoption after a restart.

    It holds each replica's API key, so it is written 0600 and replaced atomically.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[ProcessRecord]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError):
            return []
        records = []
        for item in data.get("shards", []) if isinstance(data, dict) else []:
            try:
                records.append(_structure_record(item, ProcessRecord))
            except Exception:  # an entry from an older or damaged file: skip it, keep the rest
                continue
        return records

    def save(self, records: list[ProcessRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        payload: dict[str, Any] = {"version": 1, "shards": [_unstructure_record(r) for r in records]}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle)
        os.replace(tmp, self.path)


def open_log(path: Path, *, fresh: bool) -> int:
    """A file descriptor for the engine's stdout+stderr; rotates once it grows large."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A fresh start keeps the previous run's output as .1; a long-running one rotates by size.
    if path.exists() and (fresh or path.stat().st_size > LOG_KEEP_BYTES):
        os.replace(path, path.with_name(path.name + ".1"))
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
