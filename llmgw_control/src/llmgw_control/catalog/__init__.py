"""The model catalog: models and their profiles, what each claims on a node, and the changes made
through the admin API (``service.ModelService``)."""

from .models import (
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
    "NAME", "ROUTING_POLICIES", "SHA256", "Catalog",
    "Claim", "EngineConfig", "ModelConfig", "ProfileConfig", "ProfileKey", "Resolved", "WeightsConfig",
    "model_problems", "replica_slots", "validate_models",
]
