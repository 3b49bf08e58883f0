"""State that survives a restart: the store (SQLite or PostgreSQL), migrations, the leader lease.

Use ``open_store(url_or_path)`` (or ``connect_store``) to get a ``Store``; run a
``LeaseKeeper`` over ``store.lease`` to learn whether this daemon leads. See docs/store.md.
"""

from .audit_scope import AuditScope, audit_scope, note_change
from .cluster_secrets import KEY_DIGEST_SECRET, REPLICA_KEY_SECRET, cluster_secret
from .convert import UNSET, Unset
from .errors import (
    Conflict,
    InvalidInput,
    NotFound,
    SchemaTooNew,
    StoreClosed,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
)
from .interface import Store
from .keeper import STANDBY, LeaseKeeper, Role
from .lease import Lease, SqlLease
from .migrations import MIGRATIONS, Migration, latest_version
from .ops_quota_slices import SliceAsk, SliceGrant
from .records import (
    ApiKey,
    AuditEntry,
    AuditPage,
    CapacityRecord,
    CapacityRunRecord,
    CatalogModel,
    FleetHolders,
    Group,
    KeyChanges,
    LeaseGrant,
    LeaseInfo,
    NodeIdentity,
    PublishedReplica,
    PublishedReplicas,
    Quota,
    Revisions,
    Usage,
    UsageQuery,
    UsageTotals,
)
from .sqlstore import PostgresStore, SqliteStore, SqlStore, connect_store, is_postgres_url, open_store
from .view_notify import VIEW_CHANNEL, ViewListener

__all__ = [
    "KEY_DIGEST_SECRET",
    "MIGRATIONS",
    "REPLICA_KEY_SECRET",
    "STANDBY",
    "UNSET",
    "VIEW_CHANNEL",
    "ApiKey",
    "AuditEntry",
    "AuditPage",
    "AuditScope",
    "CapacityRecord",
    "CapacityRunRecord",
    "CatalogModel",
    "Conflict",
    "FleetHolders",
    "Group",
    "InvalidInput",
    "KeyChanges",
    "Lease",
    "LeaseGrant",
    "LeaseInfo",
    "LeaseKeeper",
    "Migration",
    "NodeIdentity",
    "NotFound",
    "PostgresStore",
    "PublishedReplica",
    "PublishedReplicas",
    "Quota",
    "Revisions",
    "Role",
    "SchemaTooNew",
    "SliceAsk",
    "SliceGrant",
    "SqlLease",
    "SqlStore",
    "SqliteStore",
    "Store",
    "StoreClosed",
    "StoreError",
    "StoreTimeout",
    "StoreUnavailable",
    "Unset",
    "Usage",
    "UsageQuery",
    "UsageTotals",
    "ViewListener",
    "audit_scope",
    "cluster_secret",
    "connect_store",
    "is_postgres_url",
    "latest_version",
    "note_change",
    "open_store",
]
