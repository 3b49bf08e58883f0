"""The admin REST API under ``/api/v1`` (see docs/admin-api.md)."""

from __future__ import annotations

from .catalog_service import ModelService
from .core import Api, ApiError
from .routes import ApiContext, build_api

__all__ = ["Api", "ApiContext", "ApiError", "ModelService", "build_api"]
