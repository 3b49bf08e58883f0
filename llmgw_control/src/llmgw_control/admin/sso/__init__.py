"""Single sign-on for the dashboard through an OpenID Connect provider (see ``login.py``)."""

from __future__ import annotations

from ..org_config import OidcConfig
from .login import OidcLogin

__all__ = ["OidcLogin", "open_sso"]


def open_sso(config: OidcConfig) -> OidcLogin | None:
    return OidcLogin(config) if config.enabled else None
