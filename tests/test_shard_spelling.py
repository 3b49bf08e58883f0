"""One name per thing (issue 33): the three packages say *replica*; "shard" survives only where a
spelling is frozen outside this repository -- the v1 wire (``llmgw_shared/wire.py`` alone maps
the Python names to it), the node's state file and log directory on disk, a stored secret's
name, the HMAC domain of replica API keys, and the admin API's JSON. Each of those is listed
below by its exact line, so a new "shard" anywhere else (a comment naming a wire tag where the
Python class is meant, a ``getattr(x, "shard_id")`` that the rename left behind) fails here.

The list may only shrink: a line here is a spelling someone outside reads, not a convenience.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [
    ROOT / "llmgw_control/src/llmgw_control",
    ROOT / "llmgw_node/src/llmgw_node",
    ROOT / "shared/src/llmgw_shared",
]

# The converter between Python names and the v1 wire: its tags, keys and their docs are the point.
WIRE = "shared/src/llmgw_shared/wire.py"

# (file, the line stripped): the frozen spellings, each with why it cannot change.
ALLOWED = {
    # The admin API's JSON key of a node's replicas (clients and the dashboard read "shards").
    ("llmgw_control/src/llmgw_control/admin/api/schemas.py", "shards: list[ReplicaOnNode]"),
    (
        "llmgw_control/src/llmgw_control/admin/fleet_views.py",
        "shards=[ReplicaOnNode(s.replica_id, s.describe(), s.port) for s in node.replicas.values()],",
    ),
    ("llmgw_control/src/llmgw_control/admin/fleet_views.py", "shards=[],"),
    (
        "llmgw_control/src/llmgw_control/admin/standby_views.py",
        "shards=replicas,",
    ),
    (
        "llmgw_control/src/llmgw_control/ctl/node_cmds.py",
        'len(n["shards"]),',
    ),
    # The store's name of the secret replica API keys derive from (a renamed one would be a new key).
    ("llmgw_control/src/llmgw_control/store/cluster_secrets.py", 'REPLICA_KEY_SECRET = "shard-api-keys"'),
    # The HMAC domain of a replica's API key: engines running now were started with keys made so.
    (
        "llmgw_control/src/llmgw_control/fleet/replica_ids.py",
        '# "shard-id" and the NUL separators keep this apart from the API keys (an HMAC of the id,',
    ),
    (
        "llmgw_control/src/llmgw_control/fleet/replica_ids.py",
        'message = f"shard-id\\0{profile_key}\\0{nonce}\\0{node_id}".encode()',
    ),
    # The node's state file (<data_dir>/shards.json, its "shards" and "shard_id") and log directory
    # (<data_dir>/shards/<id>.log): an upgraded node adopts the engines an earlier release started.
    (
        "llmgw_node/src/llmgw_node/procs.py",
        '# The file a daemon of an earlier release wrote says "shard_id" (like the v1 wire): kept, so an',
    ),
    (
        "llmgw_node/src/llmgw_node/procs.py",
        '"""``<data_dir>/shards.json``: the engines this node started, for adoption after a restart.',
    ),
    ("llmgw_node/src/llmgw_node/procs.py", 'for item in data.get("shards", []) if isinstance(data, dict) else []:'),
    (
        "llmgw_node/src/llmgw_node/procs.py",
        'payload: dict[str, Any] = {"version": 1, "shards": [_unstructure_record(r) for r in records]}',
    ),
    ("llmgw_node/src/llmgw_node/supervisor.py", 'self.logs_dir = data_dir / "shards"'),
    ("llmgw_node/src/llmgw_node/supervisor.py", 'self._state_file = StateFile(data_dir / "shards.json")'),
    (
        "llmgw_node/src/llmgw_node/replica_logs.py",
        "The ring of each replica's output is its log file (``<data_dir>/shards/<id>.log``), not a list in",
    ),
    (
        "shared/src/llmgw_shared/names.py",
        "# Replica ids name the engine's log file (<data_dir>/shards/<id>.log) and appear in metric labels.",
    ),
}

SHARD = re.compile("shard", re.IGNORECASE)


def shard_lines() -> set[tuple[str, str]]:
    """Every (file, stripped line) of the packages, wire.py aside, that says shard."""
    found = set()
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            if relative == WIRE:
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                if SHARD.search(line):
                    found.add((relative, line.strip()))
    return found


def test_shard_is_only_a_frozen_spelling() -> None:
    stray = shard_lines() - ALLOWED
    assert not stray, "say replica (the wire's v1 spelling lives in wire.py alone): " + "; ".join(
        f"{path}: {line}" for path, line in sorted(stray)
    )


def test_the_allowlist_only_names_lines_that_exist() -> None:
    # A line reworded or gone leaves its entry behind: remove it, so the list only shrinks.
    stale = ALLOWED - shard_lines()
    assert not stale, "no longer in the tree, remove from ALLOWED: " + "; ".join(
        f"{path}: {line}" for path, line in sorted(stale)
    )


def test_the_wire_keeps_its_v1_spelling() -> None:
    # The exemption of wire.py is for its mapping: were the mapping gone, the exemption would hide nothing.
    wire = (ROOT / WIRE).read_text(encoding="utf-8")
    for tag in ("start_shard", "stop_shard", "drain_shard", "shard_state", "get_shard_logs", "shard_logs"):
        assert f'"{tag}"' in wire
