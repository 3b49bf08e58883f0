"""Control's own secret, kept in its data directory (replica API keys are derived from it)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def default_data_dir() -> Path:
    state = os.environ.get("STATE_DIRECTORY") or os.environ.get("XDG_STATE_HOME")
    base = Path(state) if state else Path.home() / ".local" / "state"
    return base if os.environ.get("STATE_DIRECTORY") else base / "llmgw" / "control"


def load_or_create_secret(data_dir: Path) -> bytes:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "control.secret"
    if path.exists():
        return bytes.fromhex(path.read_text().strip())
    value = secrets.token_bytes(32)
    partial = path.with_suffix(".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value.hex())
    os.replace(partial, path)
    return value
