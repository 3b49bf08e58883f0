"""``Store``: the one async interface the daemons use, whatever database is behind it.

Both implementations (``SqliteStore``, ``PostgresStore``) share every query (see ``sqlstore``),
so they behave identically; this Protocol is the contract, and what a unit test's fake store
implements. Every method runs in one transaction: on any error nothing is written.

Errors: ``InvalidInput`` (a bad argument, naming the field), ``NotFound`` (the object
addressed does not exist), ``Conflict`` (a duplicate, a cycle, a group still in use),
``StoreUnavailable``/``StoreTimeout`` (the database; retry later), ``SchemaTooNew`` at open.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, Self, Unpack

from .convert import Unset
from .lease import Lease
from .ops_quota_slices import SliceAsk, SliceGrant
from .records import (
    ApiKey,
    AuditPage,
    CapacityRecord,
    CapacityRunRecord,
    CatalogModel,
    FleetHolders,
    Group,
    KeyChanges,
    NodeIdentity,
    PublishedReplica,
    PublishedReplicas,
    Quota,
    Revisions,
    Usage,
    UsageQuery,
    UsageTotals,
)
from .view_notify import ViewListener


class Store(Protocol):
    @property
    def lease(self) -> Lease:
        """The leader lease (see ``lease.SqlLease`` and ``keeper.LeaseKeeper``)."""
        ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    async def schema_version(self) -> int: ...

    async def revisions(self) -> Revisions:
        """Change counters per kind of object; poll to learn what another daemon changed."""
        ...

    # catalog models added through the API
    async def add_model(self, name: str, document: Mapping[str, Any]) -> CatalogModel: ...
    async def update_model(self, name: str, document: Mapping[str, Any]) -> CatalogModel: ...
    async def delete_model(self, name: str) -> None: ...
    async def get_model(self, name: str) -> CatalogModel: ...
    async def list_models(self) -> list[CatalogModel]: ...

    # node identities
    async def add_node(
        self, node_id: str, token_digest: str, labels: Mapping[str, str] | None = None
    ) -> NodeIdentity: ...
    async def update_node(
        self,
        node_id: str,
        *,
        token_digest: str | Unset = ...,
        labels: Mapping[str, str] | Unset = ...,
        cordoned: bool | Unset = ...,
    ) -> NodeIdentity: ...
    async def touch_node(self, node_id: str, seen_at: datetime | None = None) -> None: ...
    async def delete_node(self, node_id: str) -> None: ...
    async def get_node(self, node_id: str) -> NodeIdentity: ...
    async def list_nodes(self) -> list[NodeIdentity]: ...

    # the group tree
    async def create_group(
        self, name: str, parent_id: str | None = None, *, group_id: str | None = None, priority: str | None = None
    ) -> Group: ...
    async def update_group(
        self,
        group_id: str,
        *,
        name: str | Unset = ...,
        parent_id: str | Unset | None = ...,
        priority: str | Unset | None = ...,
    ) -> Group: ...
    async def delete_group(self, group_id: str) -> None: ...
    async def get_group(self, group_id: str) -> Group: ...
    async def list_groups(self) -> list[Group]: ...
    async def group_subtree(self, group_id: str) -> list[str]: ...

    # API keys (digests only)
    async def create_key(
        self,
        *,
        name: str,
        group_id: str,
        digest: str,
        models: Sequence[str] | None = None,
        admin: bool = False,
        expires_at: datetime | None = None,
        key_id: str | None = None,
    ) -> ApiKey: ...
    async def update_key(
        self,
        key_id: str,
        *,
        name: str | Unset = ...,
        group_id: str | Unset = ...,
        models: Sequence[str] | Unset | None = ...,
        admin: bool | Unset = ...,
        expires_at: datetime | Unset | None = ...,
    ) -> ApiKey: ...
    async def revoke_key(self, key_id: str) -> ApiKey: ...
    async def delete_key(self, key_id: str) -> None: ...
    async def get_key(self, key_id: str) -> ApiKey: ...
    async def key_by_digest(self, digest: str) -> ApiKey | None: ...
    async def list_keys(self, group_id: str | None = None) -> list[ApiKey]: ...
    async def key_revision(self) -> int: ...
    async def keys_changed_since(self, marker: int) -> KeyChanges: ...

    # quotas
    async def set_quota(self, group_id: str, quota: Quota) -> Quota: ...
    async def get_quota(self, group_id: str) -> Quota | None: ...
    async def delete_quota(self, group_id: str) -> None: ...
    async def list_quotas(self) -> dict[str, Quota]: ...

    # quota slices (ops_quota_slices.py): limits shared by every daemon on the store
    async def lease_slices(self, holder: str, asks: Sequence[SliceAsk], *, ttl: float = 5.0) -> list[SliceGrant]: ...
    async def list_slices(self, group_id: str | None = None) -> list[tuple[str, str, str, int, int, int]]: ...

    # usage
    async def add_usage(self, deltas: Sequence[Usage]) -> None: ...
    async def query_usage(self, **query: Unpack[UsageQuery]) -> list[Usage]: ...
    async def usage_totals(self, **query: Unpack[UsageQuery]) -> UsageTotals: ...

    # capacity records (benchmark results)
    async def add_capacity(
        self,
        *,
        model: str,
        profile: str,
        node_id: str,
        engine: str,
        concurrency: int,
        tokens_per_s: float,
        ttft_p50_s: float,
        ttft_p99_s: float,
        measured_at: datetime,
        detail: Mapping[str, Any] | None = None,
    ) -> CapacityRecord: ...
    async def list_capacity(
        self,
        *,
        model: str | None = None,
        profile: str | None = None,
        node_id: str | None = None,
        engine: str | None = None,
    ) -> list[CapacityRecord]: ...
    async def delete_capacity(self, record_id: str) -> None: ...
    # capacity runs (see ops_capacity): a sweep's state and document, updated as it goes
    async def add_capacity_run(
        self,
        *,
        model: str,
        profile: str,
        node_id: str,
        kind: str,
        state: str,
        document: Mapping[str, Any],
    ) -> CapacityRunRecord: ...
    async def update_capacity_run(
        self,
        run_id: str,
        *,
        state: str,
        document: Mapping[str, Any],
        node_id: str | None = None,
        kind: str | None = None,
    ) -> CapacityRunRecord: ...
    async def get_capacity_run(self, run_id: str) -> CapacityRunRecord: ...
    async def list_capacity_runs(
        self,
        *,
        model: str | None = None,
        profile: str | None = None,
        state: str | None = None,
        limit: int = 100,
    ) -> list[CapacityRunRecord]: ...

    # cluster secrets (see ops_secrets): the first offer under a name wins
    async def shared_secret(self, name: str, offer: bytes) -> bytes: ...

    # the nodes that held replicas under a leader (see ops_fleet)
    async def fleet_holders(self) -> FleetHolders | None: ...
    async def remember_holders(self, epoch: int, nodes: Iterable[str]) -> bool: ...

    # the leader's view of ready replicas, which standbys serve from (see ops_view)
    async def replica_view(self) -> PublishedReplicas | None: ...
    async def publish_view(self, epoch: int, replicas: Iterable[PublishedReplica]) -> int | None: ...
    def view_listener(self) -> ViewListener | None: ...  # PostgreSQL's NOTIFY; None: poll

    # the model mirror's pulls (see ops_pulls): one JSON document each
    async def put_pull(self, pull_id: str, document: Mapping[str, Any]) -> None: ...
    async def list_pulls(self) -> list[dict[str, Any]]: ...
    async def delete_pull(self, pull_id: str) -> None: ...

    # the audit log (see ops_audit, audit_scope): admin changes write their rows themselves
    async def record_audit(
        self,
        *,
        actor: str,
        peer: str,
        action: str,
        outcome: str,
        resource: str,
        resource_id: str,
        changes: list[dict[str, Any]] | None = None,
    ) -> str: ...
    async def list_audit(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        actor: str | None = None,
        resource: str | None = None,
        resource_id: str | None = None,
        outcome: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> AuditPage: ...
    async def prune_audit(self, older_than: datetime) -> int: ...

    # dashboard sessions ended on the server (see ops_sessions)
    async def revoke_sessions(self, subject: str, *, before: datetime, until: datetime) -> datetime: ...
    async def session_revocations(self, now: datetime) -> dict[str, datetime]: ...
