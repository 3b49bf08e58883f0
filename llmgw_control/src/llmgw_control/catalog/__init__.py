"""The model catalog: models and their profiles, what each claims on a node, and the changes made
through the admin API (``service.ModelService``)."""

from .models import (
    LIVE_ADAPTER_ENGINES,
    ROUTING_POLICIES,
    SHA256,
    Catalog,
    Claim,
    EngineConfig,
    ModelConfig,
    ProfileConfig,
    Resolved,
    WeightsConfig,
    model_problems,
    replica_slots,
    validate_models,
)
from .profile_key import NAME, ProfileKey

__all__ = [
    "LIVE_ADAPTER_ENGINES",
    "NAME",
    "ROUTING_POLICIES",
    "SHA256",
    "Catalog",
    "Claim",
    "EngineConfig",
    "ModelConfig",
    "ProfileConfig",
    "ProfileKey",
    "Resolved",
    "WeightsConfig",
    "model_problems",
    "replica_slots",
    "validate_models",
]
