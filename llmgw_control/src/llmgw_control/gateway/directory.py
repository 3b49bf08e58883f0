"""Which replicas a requested model name means.

In gateway-only mode the names are the static replicas' models. With a catalog, a client asks for
``model`` or ``model:profile`` and the directory answers with the profile key, under which the
reconciler publishes replicas -- whether or not any is running yet (the activator then waits).
A LoRA adapter's name resolves to its base profile's key (its replicas hold the adapter), while
allow-lists, quotas, usage and metrics count it under its own name (``adapter``).
"""

from __future__ import annotations

from typing import Protocol

from ..catalog import Catalog
from ..catalog.models import ProfileConfig
from .replicas import ReplicaSet


class ModelDirectory(Protocol):
    def resolve(self, requested: str) -> str | None:
        """The profile key for a requested name, or None when no such model exists."""
        ...

    def names(self) -> list[str]:
        """What clients may ask for, for /v1/models and not-found messages."""
        ...

    def routing(self, profile_key: str) -> str:
        """The routing policy the model behind ``profile_key`` names; empty: the gateway's default."""
        ...

    def profile(self, profile_key: str) -> ProfileConfig | None:
        """The catalog profile behind ``profile_key``; None for a static replica's model."""
        ...

    def adapter(self, requested: str) -> str | None:
        """The adapter a requested name means (its own name), None for a model."""
        ...


class StaticDirectory:
    def __init__(self, replicas: ReplicaSet) -> None:
        self.replicas = replicas

    def resolve(self, requested: str) -> str | None:
        return requested if self.replicas.for_model(requested) else None

    def names(self) -> list[str]:
        return self.replicas.models()

    def routing(self, profile_key: str) -> str:
        return ""

    def profile(self, profile_key: str) -> ProfileConfig | None:
        return None

    def adapter(self, requested: str) -> str | None:
        return None


class FleetDirectory:
    """The catalog's models and profiles, plus any static replicas configured beside them."""

    def __init__(self, catalog: Catalog, replicas: ReplicaSet) -> None:
        self.catalog = catalog
        self.replicas = replicas

    def resolve(self, requested: str) -> str | None:
        resolved = self.catalog.resolve(requested)
        if resolved is not None:
            return resolved.profile_key
        return requested if self.replicas.for_model(requested) else None

    def names(self) -> list[str]:
        profile_keys = {r.profile_key for r in self.catalog.all_profiles()}
        static = [m for m in self.replicas.models() if m not in profile_keys]
        return sorted({*self.catalog.names(), *static})

    def routing(self, profile_key: str) -> str:
        resolved = self.catalog.resolve(profile_key)
        return resolved.profile.routing if resolved is not None else ""

    def profile(self, profile_key: str) -> ProfileConfig | None:
        resolved = self.catalog.resolve(profile_key)
        return resolved.profile if resolved is not None else None

    def adapter(self, requested: str) -> str | None:
        resolved = self.catalog.resolve(requested)
        return resolved.adapter.name if resolved is not None and resolved.adapter is not None else None
