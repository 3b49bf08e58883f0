"""What the admin API's routes work on, and the refusal each answers when a part is missing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ...api_errors import AdminApiError, conflict
from ...catalog.service import ModelService

if TYPE_CHECKING:
    from ...fleet.fleet import Fleet
    from ...tenancy.tenancy import Tenancy


@attrs.define
class ApiContext:
    """What the API works on; ``fleet`` is None in gateway-only mode (no agents listener)."""

    fleet: Fleet | None = None
    tenancy: Tenancy | None = None
    models: ModelService | None = None

    def the_fleet(self) -> Fleet:
        if self.fleet is None:
            raise conflict("this control daemon runs without a fleet (agents.listen is not set)", code="no_fleet")
        return self.fleet

    def the_tenancy(self) -> Tenancy:
        if self.tenancy is None:
            raise AdminApiError(503, "not_ready", "tenancy is not available on this daemon")
        return self.tenancy

    def the_models(self) -> ModelService:
        if self.models is None:
            # Without a fleet there is no catalog to change: that refusal (409) says more.
            self.the_fleet()
            raise AdminApiError(503, "not_ready", "the model catalog is not available on this daemon")
        return self.models
