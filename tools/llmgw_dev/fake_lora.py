"""vLLM's run-time LoRA endpoints, as the fake engine serves them (``fake_served_engine`` with
``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).

- ``POST /v1/load_lora_adapter {"lora_name": N, "lora_path": DIR}``: 200 once loaded; 400 when
  the name is loaded already, the directory has no ``adapter_config.json`` or its rank ``r`` is
  above ``--max-lora-rank`` (what vLLM refuses);
- ``POST /v1/unload_lora_adapter {"lora_name": N}``: 200; 404 for a name not loaded.

Bodies are checked strictly: a JSON object with exactly those keys, non-empty strings (the node
must send nothing else). A request then selects an adapter by ``model`` = its name: the answer's
``model`` is that name and its text starts with ``[lora:N]`` (the adapter's "effect"), and a
model name that is neither the served model nor a loaded adapter is vLLM's 404.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

LOAD = "/v1/load_lora_adapter"
UNLOAD = "/v1/unload_lora_adapter"
PATHS = (LOAD, UNLOAD)


@attrs.define
class FakeLoras:
    """The adapters a fake vLLM has loaded (name -> directory), and what it was started with."""

    max_lora_rank: int = 16
    loaded: dict[str, str] = attrs.field(factory=dict)
    # Every call, in order: ("load" | "unload", name, status), for tests that look from inside.
    calls: list[tuple[str, str, int]] = attrs.field(factory=list)

    def handle(self, path: str, parsed: Any) -> tuple[int, str]:
        """(status, message) for one call to ``path``."""
        status, message = self._handle(path, parsed)
        name = parsed.get("lora_name", "") if isinstance(parsed, dict) else ""
        self.calls.append(("load" if path == LOAD else "unload", str(name), status))
        return status, message

    def _handle(self, path: str, parsed: Any) -> tuple[int, str]:
        keys = {"lora_name", "lora_path"} if path == LOAD else {"lora_name"}
        if not isinstance(parsed, dict) or set(parsed) != keys:
            return 400, f"the body must be a JSON object with exactly {sorted(keys)}"
        if not all(isinstance(v, str) and v for v in parsed.values()):
            return 400, "lora_name and lora_path must be non-empty strings"
        name = parsed["lora_name"]
        if path == UNLOAD:
            if self.loaded.pop(name, None) is None:
                return 404, f"The lora adapter '{name}' cannot be found."
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        if name in self.loaded:
            return 400, f"The lora adapter '{name}' has already been loaded."
        problem = _adapter_problem(Path(parsed["lora_path"]), self.max_lora_rank)
        if problem:
            return 400, problem
        self.loaded[name] = parsed["lora_path"]
        return 200, f"Success: LoRA adapter '{name}' added successfully."


def _adapter_problem(directory: Path, max_rank: int) -> str:
    try:
        config = json.loads((directory / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"Loading lora {directory} failed: No adapter found for {directory} ({type(exc).__name__})"
    rank = config.get("r", 8) if isinstance(config, dict) else 8
    if not isinstance(rank, int) or rank > max_rank:
        return f"LoRA rank {rank} is greater than max_lora_rank {max_rank}."
    return ""
