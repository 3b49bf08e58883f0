"""The control plane's parts as one daemon built them (``app.build_fleet``), for the admin API,
the fleet metrics and tests."""

from __future__ import annotations

import attrs

from ..catalog import Catalog
from ..catalog.service import ModelService
from ..gateway.activator import Activator
from .agents import AgentService
from .capacity_runs import CapacityRuns
from .files import FileServer
from .inventory import Inventory
from .leadership import Leadership
from .onboarding import Onboarding
from .reconciler import Reconciler


@attrs.define
class Fleet:
    catalog: Catalog
    inventory: Inventory
    reconciler: Reconciler
    agents: AgentService
    activator: Activator
    files: FileServer | None
    leadership: Leadership | None = None
    onboarding: Onboarding | None = None
    # The models added through the admin API, followed in the store (``catalog.service``).
    models: ModelService | None = None
    # Capacity runs (``capacity_runs``): sweeps started from the admin API, learnt by the reconciler.
    capacity: CapacityRuns | None = None
