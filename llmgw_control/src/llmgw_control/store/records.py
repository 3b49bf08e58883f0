"""What the store hands out and takes in: plain attrs values, no behaviour tied to a backend.

Times are timezone-aware UTC ``datetime`` values. The database keeps them as integer
microseconds since the Unix epoch (exact on both backends, unlike floats), see ``convert``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypedDict

import attrs


@attrs.frozen
class CatalogModel:
    """A model added through the admin API; ``document`` is the model definition as JSON."""

    name: str
    document: Mapping[str, Any]
    created_at: datetime
    updated_at: datetime


@attrs.frozen
class NodeIdentity:
    """A node allowed to join: its id, the digest of its join token, labels, cordon flag."""

    id: str
    token_digest: str
    labels: Mapping[str, str]
    cordoned: bool
    created_at: datetime
    # Written rarely (the caller decides how often): it is for operators, not for liveness.
    last_seen_at: datetime | None


@attrs.frozen
class Group:
    """A node of the tenancy tree; ``parent_id`` is None for a root."""

    id: str
    name: str
    parent_id: str | None
    created_at: datetime
    updated_at: datetime
    # "interactive" or "batch": how its requests are ordered when they wait for a replica slot.
    # None: the parent's (a root without one is interactive).
    priority: str | None = None


@attrs.frozen
class ApiKey:
    """A client key as stored: only the caller-computed digest of the secret, never the secret."""

    id: str
    name: str
    group_id: str
    digest: str
    # None: every model; otherwise the models this key may use.
    models: tuple[str, ...] | None
    admin: bool
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    # The key revision at which this row last changed (see ``Store.keys_changed_since``).
    revision: int

    def usable_at(self, now: datetime) -> bool:
        """True when the key is neither revoked nor expired at ``now``."""
        if self.revoked_at is not None and self.revoked_at <= now:
            return False
        return self.expires_at is None or now < self.expires_at


@attrs.frozen
class KeyChanges:
    """Keys changed after a marker: apply ``changed`` (upserts) and drop ``deleted`` ids.

    ``revision`` is the marker to pass next time. When ``reset`` is true, ``changed`` is every
    key there is: replace the table instead of merging.
    """

    revision: int
    changed: tuple[ApiKey, ...]
    deleted: tuple[str, ...]
    reset: bool = False


@attrs.frozen
class Quota:
    """Limits for one group; None means no limit of that kind."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    concurrent_requests: int | None = None


class UsageQuery(TypedDict, total=False):
    """Which usage a query means: every filter optional, all those given must hold. ``group_id``
    with ``include_descendants`` means its whole subtree; ``since`` rounds down to its hour,
    ``until`` is exclusive. The store's, the tenancy service's and the admin API's usage queries
    take these keywords (``**query: Unpack[UsageQuery]``)."""

    group_id: str | None
    include_descendants: bool
    key_id: str | None
    model: str | None
    since: datetime | None
    until: datetime | None


@attrs.frozen
class Usage:
    """Counts for one (hour, key, group, model).

    As input to ``add_usage`` it is a delta and ``hour`` may be any time within the hour; as
    output ``hour`` is the start of the hour. ``key_id``/``group_id`` are "" for requests served
    without a key (an open gateway).
    """

    hour: datetime
    key_id: str
    group_id: str
    model: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@attrs.frozen
class UsageTotals:
    requests: int
    prompt_tokens: int
    completion_tokens: int


@attrs.frozen
class CapacityRecord:
    """One benchmark result: how fast ``model``/``profile`` ran on ``node_id`` with ``engine``."""

    id: str
    model: str
    profile: str
    node_id: str
    engine: str
    concurrency: int
    tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    measured_at: datetime
    detail: Mapping[str, Any]


@attrs.frozen
class CapacityRunRecord:
    """One capacity run (a sweep of concurrency levels): ``document`` holds its settings, what
    makes it comparable (engine, weights digest, profile arguments, node facts) and its levels."""

    id: str
    model: str
    profile: str
    node_id: str
    # CPU model + GPU models + engine version: where the run's numbers apply (fleet/capacity.py).
    kind: str
    # queued | running | done | failed | cancelled
    state: str
    created_at: datetime
    updated_at: datetime
    document: Mapping[str, Any]


@attrs.frozen
class Revisions:
    """Change counters per kind of object: poll these (cheap) and reload what moved.

    Every write to a kind bumps its counter in the same transaction, so a daemon that is not the
    writer (a standby serving traffic, a second leader-less reader) sees changes within one poll.
    """

    models: int
    nodes: int
    groups: int
    keys: int
    quotas: int


@attrs.frozen
class LeaseGrant:
    """The lease is ours until ``expires_at`` (the database's clock); ``epoch`` fences commands."""

    epoch: int
    expires_at: datetime


@attrs.frozen
class LeaseInfo:
    """Who holds the leader lease now; ``holder``/``address`` are None when nobody does."""

    holder: str | None
    address: str | None
    epoch: int
    expires_at: datetime | None


@attrs.frozen
class FleetHolders:
    """The nodes that held replicas when the leader of ``epoch`` last wrote them down."""

    epoch: int
    nodes: frozenset[str]
    written_at: datetime


@attrs.frozen
class PublishedReplica:
    """One ready replica as the leader publishes it (never its bearer key: derived per daemon)."""

    id: str
    profile_key: str  # the profile key clients' requests resolve to (stored as "key")
    url: str
    slots: int
    served_name: str = ""
    # Its LoRA adapters, (model name, scale) in the engine's order, and how a request selects one
    # (gateway/adapters.py).
    adapters: tuple[tuple[str, float], ...] = ()
    adapter_mode: str = ""


@attrs.frozen
class PublishedReplicas:
    """The leader's published ready replicas: ``revision`` goes up on every write."""

    epoch: int
    revision: int
    replicas: tuple[PublishedReplica, ...]
    written_at: datetime


@attrs.frozen
class AuditEntry:
    """One row of the audit log: when, who, from where, what, and the fields it changed.

    ``actor`` is ``key:<admin key id>``, ``user:<dashboard user>``, ``loopback`` (the admin
    listener without keys) or ``daemon:<holder>`` (leadership); ``outcome`` is ``ok`` or
    ``refused``; ``changes`` lists ``{resource, id, op, before, after}``, secrets redacted.
    """

    id: str
    at: datetime
    actor: str
    peer: str
    action: str
    outcome: str
    resource: str
    resource_id: str
    changes: list[dict[str, Any]]


@attrs.frozen
class AuditPage:
    entries: list[AuditEntry]
    next_cursor: str | None
