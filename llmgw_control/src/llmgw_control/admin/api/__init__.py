"""The admin REST API under ``/api/v1`` (see docs/admin-api.md)."""

from __future__ import annotations

from .context import ApiContext
from .core import Api
from .routes import build_api

__all__ = ["Api", "ApiContext", "build_api"]
