"""The node's state file (``<data_dir>/shards.json``) is stored data: a daemon after an upgrade
must adopt the engines the one before it recorded. Its JSON is frozen here, whatever the Python
names of its fields become (the records say "replica"; the file, like the v1 wire, says "shard")."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw_node.procs import ProcessRecord, StateFile
from llmgw_shared.wire import ReplicaSpec

SPEC = ReplicaSpec(
    replica_id="tiny-0", engine="llama.cpp", engine_version="b1", weights=None, port=8101, api_key="sk", model_dir="/m"
)
RECORD = ProcessRecord(replica_id="tiny-0", pid=42, ticks=7, binary="/b", weights="/w", log="/l", spec=SPEC, restarts=1)
FROZEN = {
    "version": 1,
    "shards": [
        {
            "shard_id": "tiny-0",
            "pid": 42,
            "ticks": 7,
            "binary": "/b",
            "weights": "/w",
            "log": "/l",
            "spec": {
                "shard_id": "tiny-0",
                "engine": "llama.cpp",
                "engine_version": "b1",
                "weights": None,
                "port": 8101,
                "api_key": "sk",
                "args": [],
                "env": {},
                "start_timeout_s": 120.0,
                "max_restarts": 5,
                "model_dir": "/m",
            },
            "restarts": 1,
        }
    ],
}


def test_the_state_file_keeps_its_v1_keys(tmp_path: Path) -> None:
    path = tmp_path / "shards.json"
    StateFile(path).save([RECORD])
    assert json.loads(path.read_text()) == FROZEN


def test_a_state_file_written_before_the_rename_is_adopted(tmp_path: Path) -> None:
    path = tmp_path / "shards.json"
    path.write_text(json.dumps(FROZEN))
    assert StateFile(path).load() == [RECORD]


def test_a_llama_cpp_record_keeps_the_adapters_its_engine_was_started_with(tmp_path: Path) -> None:
    # A replica whose node refused one adapter: adopted after a restart, it still holds the others only.
    record = ProcessRecord(
        replica_id="tiny-0",
        pid=42,
        ticks=7,
        binary="/b",
        weights="/w",
        log="/l",
        spec=SPEC,
        adapters=["x"],
        adapter_problem="adapter q not loaded: sha256 differs",
    )
    path = tmp_path / "shards.json"
    StateFile(path).save([record])
    stored = json.loads(path.read_text())["shards"][0]
    assert (stored["adapters"], stored["adapter_problem"]) == (["x"], "adapter q not loaded: sha256 differs")
    assert StateFile(path).load() == [record]
