"""``llmgw-control ctl``: the command line over the admin REST API (and nothing else)."""

from __future__ import annotations

from .main import main

__all__ = ["main"]
