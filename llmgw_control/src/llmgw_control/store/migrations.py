"""Versioned schema migrations, applied in one transaction when a store opens.

Each step has a number; ``schema_version`` records every step applied. A database whose highest
step is beyond what this code knows was written by a newer llmgw, and we refuse to touch it
(``SchemaTooNew``) rather than guess. Steps are append-only: never edit a released step, add
the next one. The DDL is written in the SQL both SQLite and PostgreSQL accept (TEXT, BIGINT,
BOOLEAN, DOUBLE PRECISION; ids are text, not serials), so one list serves both backends.

Times are BIGINT microseconds since the Unix epoch, UTC: exact and identical on both backends.
"""

from __future__ import annotations

import attrs

from .backend import Backend, Tx
from .errors import SchemaTooNew


@attrs.frozen
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


# Kinds of object with a change counter in ``revisions`` (see records.Revisions).
REVISION_KINDS = ("models", "nodes", "groups", "keys", "quotas")

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "catalog, nodes, tenancy (groups, keys, quotas, usage), capacity, leader lease",
        (
            "CREATE TABLE revisions (kind TEXT PRIMARY KEY, value BIGINT NOT NULL)",
            "INSERT INTO revisions (kind, value) VALUES " + ", ".join(f"('{kind}', 0)" for kind in REVISION_KINDS),
            """CREATE TABLE catalog_models (
                name TEXT PRIMARY KEY,
                document TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                updated_at BIGINT NOT NULL)""",
            """CREATE TABLE nodes (
                id TEXT PRIMARY KEY,
                token_digest TEXT NOT NULL,
                labels TEXT NOT NULL,
                cordoned BOOLEAN NOT NULL,
                created_at BIGINT NOT NULL,
                last_seen_at BIGINT)""",
            # "groups" is a keyword in SQLite's window syntax; a prefixed name avoids quoting.
            """CREATE TABLE tenant_groups (
                id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                parent_id TEXT REFERENCES tenant_groups (id),
                created_at BIGINT NOT NULL,
                updated_at BIGINT NOT NULL)""",
            # NULLs are distinct in a plain UNIQUE (parent_id, name) on both databases, which
            # would allow two roots with one name; the expression index closes that gap.
            "CREATE UNIQUE INDEX tenant_groups_sibling_name ON tenant_groups (COALESCE(parent_id, ''), name)",
            "CREATE INDEX tenant_groups_parent ON tenant_groups (parent_id)",
            """CREATE TABLE api_keys (
                id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                group_id TEXT NOT NULL REFERENCES tenant_groups (id),
                digest TEXT NOT NULL UNIQUE,
                models TEXT,
                admin BOOLEAN NOT NULL,
                created_at BIGINT NOT NULL,
                expires_at BIGINT,
                revoked_at BIGINT,
                revision BIGINT NOT NULL)""",
            "CREATE INDEX api_keys_revision ON api_keys (revision)",
            "CREATE INDEX api_keys_group ON api_keys (group_id)",
            # Tombstones, so that a daemon refreshing incrementally learns about deletions.
            "CREATE TABLE deleted_keys (id TEXT PRIMARY KEY, revision BIGINT NOT NULL)",
            "CREATE INDEX deleted_keys_revision ON deleted_keys (revision)",
            """CREATE TABLE quotas (
                group_id TEXT PRIMARY KEY REFERENCES tenant_groups (id) ON DELETE CASCADE,
                requests_per_minute BIGINT,
                tokens_per_minute BIGINT,
                tokens_per_day BIGINT,
                concurrent_requests BIGINT,
                updated_at BIGINT NOT NULL)""",
            # No foreign keys: usage is history and outlives the keys and groups it names.
            """CREATE TABLE usage_hourly (
                hour BIGINT NOT NULL,
                key_id TEXT NOT NULL,
                group_id TEXT NOT NULL,
                model TEXT NOT NULL,
                requests BIGINT NOT NULL,
                prompt_tokens BIGINT NOT NULL,
                completion_tokens BIGINT NOT NULL,
                PRIMARY KEY (hour, key_id, group_id, model))""",
            "CREATE INDEX usage_hourly_group ON usage_hourly (group_id, hour)",
            "CREATE INDEX usage_hourly_key ON usage_hourly (key_id, hour)",
            """CREATE TABLE capacity (
                id TEXT PRIMARY KEY,
                model TEXT NOT NULL,
                profile TEXT NOT NULL,
                node_id TEXT NOT NULL,
                engine TEXT NOT NULL,
                concurrency BIGINT NOT NULL,
                tokens_per_s DOUBLE PRECISION NOT NULL,
                ttft_p50_s DOUBLE PRECISION NOT NULL,
                ttft_p99_s DOUBLE PRECISION NOT NULL,
                measured_at BIGINT NOT NULL,
                detail TEXT NOT NULL)""",
            "CREATE INDEX capacity_model ON capacity (model, profile, measured_at)",
            # Exactly one row, created here, so acquiring is always a plain UPDATE.
            """CREATE TABLE leader_lease (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                holder TEXT,
                address TEXT,
                epoch BIGINT NOT NULL,
                expires_at BIGINT NOT NULL)""",
            "INSERT INTO leader_lease (id, holder, address, epoch, expires_at) VALUES (1, NULL, NULL, 0, 0)",
        ),
    ),
    Migration(
        2,
        "cluster secrets shared by every control daemon on one database",
        (
            # Random values every daemon must agree on (the key-digest server secret, the replica
            # API key secret); the first daemon inserts each one, the rest read it. See
            # docs/failover.md for why these live in the database.
            """CREATE TABLE cluster_secrets (
                name TEXT PRIMARY KEY,
                value TEXT NOT NULL,
                created_at BIGINT NOT NULL)""",
        ),
    ),
    Migration(
        3,
        "a group's priority class for requests waiting for a replica slot",
        (
            # NULL: inherited from the parent group. Both databases add a nullable column in
            # place, without rewriting the table.
            "ALTER TABLE tenant_groups ADD COLUMN priority TEXT",
        ),
    ),
    Migration(
        4,
        "the nodes that held replicas under the leader of an epoch (a new leader waits for them)",
        (
            # One row: written by the leader when the set changes (not per heartbeat), read by
            # the next leader, whose hold after a takeover ends once all of them have reported.
            # ``nodes`` is a JSON list; epoch 0 means never written.
            """CREATE TABLE fleet_holders (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                epoch BIGINT NOT NULL,
                nodes TEXT NOT NULL,
                updated_at BIGINT NOT NULL)""",
            "INSERT INTO fleet_holders (id, epoch, nodes, updated_at) VALUES (1, 0, '[]', 0)",
        ),
    ),
    Migration(
        5,
        "the model mirror's pulls and the draft catalog entries they made",
        (
            # One JSON document per pull (mirror/pulls.py): what was asked, how it ended, and
            # the draft model the operator publishes. Progress lives in memory, not here.
            """CREATE TABLE model_pulls (
                id TEXT PRIMARY KEY,
                document TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                updated_at BIGINT NOT NULL)""",
        ),
    ),
    Migration(
        6,
        "capacity runs: a benchmark sweep with its state, its levels and what makes it comparable",
        (
            # History, like ``capacity``: no foreign keys, a run outlives its node and model.
            # ``kind`` (CPU model + GPU models + engine version) is a column because admission and
            # placement look runs up by it; the sweep settings, node facts, weights digest and
            # per-level results are one JSON document (read whole, never queried into).
            """CREATE TABLE capacity_runs (
                id TEXT PRIMARY KEY,
                model TEXT NOT NULL,
                profile TEXT NOT NULL,
                node_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                state TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                updated_at BIGINT NOT NULL,
                document TEXT NOT NULL)""",
            "CREATE INDEX capacity_runs_model ON capacity_runs (model, profile, created_at)",
        ),
    ),
    Migration(
        7,
        "the leader's view of ready replicas, which standbys serve from",
        (
            # One row (fleet/view.py): the ready replicas as a JSON list, the lease epoch of the
            # leader that wrote it (a write with an older epoch than the lease's is refused, so a
            # deposed leader cannot hide its successor's replicas) and a revision readers compare.
            # No bearer keys: every daemon derives them from the shared cluster secret.
            """CREATE TABLE replica_view (
                id INTEGER PRIMARY KEY,
                epoch BIGINT NOT NULL,
                revision BIGINT NOT NULL,
                replicas TEXT NOT NULL,
                updated_at BIGINT NOT NULL)""",
            "INSERT INTO replica_view (id, epoch, revision, replicas, updated_at) VALUES (1, 0, 0, '[]', 0)",
        ),
    ),
    Migration(
        8,
        "quota slices leased by each daemon, so limits hold for the sum of all daemons",
        (
            # One row per grant (ops_quota_slices.py): ``amount`` counts against the group's
            # limit of ``kind`` until ``counts_until`` (the window: a minute after the last spend
            # can happen, the end of the UTC day, or the lease's end for concurrent slots); the
            # holder may spend it until ``expires_at``.
            """CREATE TABLE quota_slices (
                id TEXT PRIMARY KEY,
                group_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                holder TEXT NOT NULL,
                amount BIGINT NOT NULL,
                granted_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                counts_until BIGINT NOT NULL)""",
            "CREATE INDEX quota_slices_by_group ON quota_slices (group_id, kind)",
        ),
    ),
    Migration(
        9,
        "the audit log: who changed what through the admin API, and refused admin actions",
        (
            # One row per admin action (ops_audit.py), written in the transaction of the change it
            # describes; ``changes`` is a JSON list of {resource, id, op, before, after}, secrets
            # redacted. Ids are random (several daemons write), pages are ordered by (at, id).
            """CREATE TABLE audit_log (
                id TEXT PRIMARY KEY,
                at BIGINT NOT NULL,
                actor TEXT NOT NULL,
                peer TEXT NOT NULL,
                action TEXT NOT NULL,
                outcome TEXT NOT NULL,
                resource TEXT NOT NULL,
                resource_id TEXT NOT NULL,
                changes TEXT NOT NULL)""",
            "CREATE INDEX audit_log_at ON audit_log (at, id)",
            "CREATE INDEX audit_log_actor ON audit_log (actor, at)",
            "CREATE INDEX audit_log_resource ON audit_log (resource, resource_id, at)",
        ),
    ),
    Migration(
        10,
        "dashboard sessions ended on the server: a user's sessions issued before a time, or one logged-out session",
        (
            # One row per subject (ops_sessions.py): ``user:<name>`` or ``key:<id>`` voids every
            # session of that operator issued before ``revoked_before``; ``session:<id>`` voids one
            # (a logout). ``expires_at``: when every session the row voids has expired anyway, after
            # which the row is deleted. Times in microseconds, as everywhere.
            """CREATE TABLE session_revocations (
                subject TEXT PRIMARY KEY,
                revoked_before BIGINT NOT NULL,
                expires_at BIGINT NOT NULL)""",
        ),
    ),
)

# An arbitrary constant: the key of the PostgreSQL advisory lock that serialises daemons
# migrating the same database at the same moment.
_MIGRATION_LOCK_KEY = 0x6C6D6777  # "lmgw"


def latest_version(migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    return migrations[-1].version if migrations else 0


def _check(migrations: tuple[Migration, ...]) -> None:
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migration versions must be 1..n in order, got {versions}")


async def migrate(backend: Backend, migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    """Bring the database up to the newest step; return the schema version it is now at."""
    _check(migrations)
    known = latest_version(migrations)

    def apply(tx: Tx) -> int:
        if tx.dialect == "postgresql":
            tx.rows("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK_KEY,))
        # On SQLite the write transaction (BEGIN IMMEDIATE) already excludes other writers.
        tx.run(
            """CREATE TABLE IF NOT EXISTS schema_version (
                version INTEGER PRIMARY KEY,
                description TEXT NOT NULL,
                applied_at BIGINT NOT NULL)"""
        )
        row = tx.one("SELECT MAX(version) FROM schema_version")
        current = int(row[0]) if row is not None and row[0] is not None else 0
        if current > known:
            raise SchemaTooNew(current, known)
        for step in migrations[current:]:
            for statement in step.statements:
                tx.run(statement)
            tx.run(
                "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, now_us())",
                (step.version, step.description),
            )
        return known

    return await backend.run(apply, write=True)


async def schema_version(backend: Backend) -> int:
    def read(tx: Tx) -> int:
        row = tx.one("SELECT MAX(version) FROM schema_version")
        return int(row[0]) if row is not None and row[0] is not None else 0

    return await backend.run(read, write=False)
