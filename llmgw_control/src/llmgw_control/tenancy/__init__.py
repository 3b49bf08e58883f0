"""Tenancy: API keys, the group tree, quota admission and usage accounting (see docs/tenancy.md).

Build it as: ``KeyDigester(load_or_create_server_secret(path))`` → ``TenancyState(store,
digester)`` (run ``state.run`` in the nursery with ``nursery.start``: it returns once loaded) →
``TenancyAdmission(state, usage)`` for the gateway, ``UsageFlusher(store, usage).run`` in the
nursery, ``TenancyService(store, state, usage)`` for the admin API.
"""

from .admission import Admission, OpenAdmission, OpenTicket, TenancyAdmission, TenancyTicket, Ticket
from .budget import CONCURRENT, RPM, TPD, TPM, GroupBudget, QuotaRefusal
from .keys import KEY_PREFIX, KeyDigester, bearer_token, load_or_create_server_secret, new_key_secret
from .keytable import KeyEntry, KeyTable
from .service import CreatedKey, TenancyService, parse_quota
from .state import TenancyState
from .tree import GroupTree
from .usage import UsageAccumulator, UsageFlusher
from .windows import Clock, DayCounter, SlidingWindow

__all__ = [
    "CONCURRENT",
    "KEY_PREFIX",
    "RPM",
    "TPD",
    "TPM",
    "Admission",
    "Clock",
    "CreatedKey",
    "DayCounter",
    "GroupBudget",
    "GroupTree",
    "KeyDigester",
    "KeyEntry",
    "KeyTable",
    "OpenAdmission",
    "OpenTicket",
    "QuotaRefusal",
    "SlidingWindow",
    "TenancyAdmission",
    "TenancyService",
    "TenancyState",
    "TenancyTicket",
    "Ticket",
    "UsageAccumulator",
    "UsageFlusher",
    "bearer_token",
    "load_or_create_server_secret",
    "new_key_secret",
    "parse_quota",
]
