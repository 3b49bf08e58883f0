"""The model catalog: models and their profiles, what each claims on a node, and the changes made
through the admin API (``service.ModelService``)."""

from .models import (
    NAME,
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
    profile_key,
    replica_slots,
    validate_models,
)

__all__ = [
    "NAME", "ROUTING_POLICIES", "SHA256", "Catalog",
    "Claim", "EngineConfig", "ModelConfig", "ProfileConfig", "Resolved", "WeightsConfig",
    "model_problems", "profile_key", "replica_slots", "validate_models",
]
