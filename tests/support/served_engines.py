"""vLLM and SGLang as a node runs them, faked: scripts named by path in a node's [[engines]],
model directories in the shapes a node accepts (a local directory, a Hub cache snapshot)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"
VERSIONS = {"vllm": "0.9.1", "sglang": "0.4.9"}
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def engine_script(where: Path, engine: str) -> Path:
    """An executable that is ``vllm`` (or SGLang's Python) to whoever runs it."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / ("vllm" if engine == "vllm" else "python-sglang")
    path.write_text(
        f'#!/bin/sh\nPYTHONPATH="{TOOLS}" exec "{sys.executable}" -m llmgw_dev.fake_served_engine {engine} "$@"\n'
    )
    path.chmod(0o755)
    return path


def engines_config(where: Path) -> list[dict[str, object]]:
    """The node config's [[engines]] for both, as an operator writes them."""
    return [
        {"name": "vllm", "path": str(engine_script(where, "vllm")), "version": VERSIONS["vllm"]},
        {
            "name": "sglang",
            "path": str(engine_script(where, "sglang")),
            "version": VERSIONS["sglang"],
            "version_args": ["-c", "import sglang; print(sglang.__version__)"],
        },
    ]


def model_directory(path: Path) -> Path:
    """A model directory as the Hub ships one (the fake needs only config.json)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], "max_position_embeddings": 4096}')
    (path / "tokenizer.json").write_text("{}")
    return path


def adapter_directory(path: Path, rank: int = 8) -> Path:
    """A PEFT LoRA adapter directory as vLLM loads one (the fake reads adapter_config.json's rank)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 16}))
    (path / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    return path


def hub_snapshot(hub_cache: Path, repo: str, revision: str = "main") -> str:
    """A snapshot in the Hub client's cache layout; returns its ``hub:`` model_dir."""
    owner, name = repo.split("/")
    root = hub_cache / f"models--{owner}--{name}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / revision).write_text(HUB_COMMIT)
    model_directory(root / "snapshots" / HUB_COMMIT)
    return f"hub:{repo}@{revision}"
