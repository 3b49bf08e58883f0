"""The v1 wire bytes are frozen: every message, encoded today, is byte-identical to a frame captured
from the protocol as deployed nodes speak it, and each captured frame decodes to the same message.

Python names may change (control and the node say "replica" where the v1 wire says "shard"), the
frames may not: a node or control of an older release must keep understanding every frame. The
samples set every field away from its default (so every key a message can carry is pinned), and
a second sample of each leaves the defaults out (pinning what is omitted). Never edit a sample to
make a change pass: a new field is a new sample, and the old ones must still decode.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_shared import wire
from llmgw_shared.facts import GpuFacts, HostFacts
from llmgw_shared.wire import (
    TAGS,
    Ack,
    AdapterSpec,
    AssetProvenance,
    DrainReplica,
    EngineProvenance,
    EngineSpec,
    EngineState,
    EngineStateReport,
    Error,
    GetReplicaLogs,
    Heartbeat,
    Hello,
    Message,
    Refuse,
    RemoveWeights,
    ReplicaLogsReply,
    ReplicaSpec,
    ReplicaState,
    ReplicaStateReport,
    SetAdapters,
    SetEngines,
    StartReplica,
    StopReplica,
    WeightsHeld,
    WeightsSpec,
    Welcome,
    decode,
    encode,
)

GPU = GpuFacts(index=1, name="NVIDIA L4", uuid="GPU-1234", memory_total_mib=23034, memory_free_mib=22000)
FACTS = HostFacts(
    probed=True,
    probed_at=1790000000.5,
    hostname="gpu-1",
    os_id="debian",
    os_name="Debian GNU/Linux",
    os_version="12",
    kernel="6.1.0",
    arch="x86_64",
    cpu_model="AMD EPYC",
    cores=2,
    cpu_features=["avx2"],
    ram_total_mib=24000,
    ram_available_mib=20000,
    data_dir="/var/lib/llmgw-node",
    disk_free_mib=80000,
    nvidia_driver="550.54.15",
    gpus=[GPU],
    warnings=["w"],
    gpu_backend="cuda",
    gpu_backends=["cuda"],
    gpus_unusable="none",
    degraded="no",
)
PROVENANCE = EngineProvenance(
    source="http://m/releases",
    index_sha256="cd" * 32,
    assets=[AssetProvenance("a.tar.gz", "http://m/a", "ef" * 32, 6)],
    installed_at=1790000000.25,
    signed_by="RWQ",
    control_epoch=3,
    archives_kept=True,
    backend="cuda",
    runtime="OS packages",
)
ENGINE = EngineState(
    name="llama.cpp",
    version="b1",
    status="installed",
    detail="d",
    reported_version="v",
    binary="/x/llama-server",
    provenance=PROVENANCE,
)
WEIGHTS = WeightsSpec(url="http://m/w.gguf", sha256="ab" * 32, size=300)
SPEC = ReplicaSpec(
    replica_id="tiny-0",
    engine="llama.cpp",
    engine_version="b1",
    weights=WEIGHTS,
    port=8101,
    api_key="sk",
    args=["-c", "1024"],
    env={"A": "1"},
    start_timeout_s=60.5,
    max_restarts=2,
    model_dir="hub:o/n",
    devices=[0, 1],
    adapters=[AdapterSpec("sql", WEIGHTS)],
)
STATE = ReplicaState(
    replica_id="tiny-0",
    status="ready",
    detail="ok",
    port=8101,
    pid=42,
    restarts=1,
    last_lines=["l"],
    rss_mib=812,
    vram_mib=4096,
)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
HELD = WeightsHeld(sha256="ab" * 32, size=300, last_used=1790000000.0, in_use=True)

# (message, the frame it is on the wire): every field set, then the defaults left out.
GOLDEN: list[tuple[Message, str | None]] = [
    (
        Hello(
            protocol_version=1,
            node_id="gpu-1",
            join_token="j",
            facts=FACTS,
            engines=[ENGINE],
            replicas=[STATE],
            address="10.0.0.5",
            weights=[HELD],
        ),
        '{"protocol_version":1,"node_id":"gpu-1","join_token":"j","facts":{"probed":true,"probed_at":1790000000.5,'
        '"hostname":"gpu-1","os_id":"debian","os_name":"Debian GNU/Linux","os_version":"12","kernel":"6.1.0",'
        '"arch":"x86_64","cpu_model":"AMD EPYC","cores":2,"cpu_features":["avx2"],"ram_total_mib":24000,'
        '"ram_available_mib":20000,"data_dir":"/var/lib/llmgw-node","disk_free_mib":80000,'
        '"nvidia_driver":"550.54.15","gpus":[{"index":1,"name":"NVIDIA L4","uuid":"GPU-1234",'
        '"memory_total_mib":23034,"memory_free_mib":22000}],"warnings":["w"],"gpu_backend":"cuda",'
        '"gpu_backends":["cuda"],"gpus_unusable":"none","degraded":"no"},"engines":[{"name":"llama.cpp",'
        '"version":"b1","status":"installed","detail":"d","reported_version":"v","binary":"/x/llama-server",'
        '"provenance":{"source":"http://m/releases","index_sha256":"' + "cd" * 32 + '","assets":[{"name":'
        '"a.tar.gz","url":"http://m/a","sha256":"' + "ef" * 32 + '","size":6}],"installed_at":1790000000.25,'
        '"signed_by":"RWQ","control_epoch":3,"archives_kept":true,"backend":"cuda","runtime":"OS packages"}}],'
        '"shards":[{"shard_id":"tiny-0","status":"ready","detail":"ok","port":8101,"pid":42,"restarts":1,'
        '"last_lines":["l"],"rss_mib":812,"vram_mib":4096}],"address":"10.0.0.5","weights":[{"sha256":"'
        + "ab" * 32
        + '","size":300,"last_used":1790000000.0,"in_use":true}],"type":"hello"}',
    ),
    (Hello(protocol_version=1, node_id="n", join_token="j", facts=FACTS, engines=[], replicas=[]), None),
    (
        Welcome(protocol_version=1, heartbeat_interval_s=2.5),
        '{"protocol_version":1,"heartbeat_interval_s":2.5,"type":"welcome"}',
    ),
    (Refuse(reason="standby", leader="ws://l"), '{"reason":"standby","leader":"ws://l","type":"refuse"}'),
    (Refuse(reason="no"), '{"reason":"no","leader":"","type":"refuse"}'),
    (Heartbeat(seq=8, facts=None, engines=[ENGINE], replicas=[STATE], weights=[HELD]), None),
    (Heartbeat(seq=7), '{"seq":7,"facts":null,"engines":[],"shards":[],"type":"heartbeat"}'),
    (Error(message="bad", in_reply_to="c9"), '{"message":"bad","in_reply_to":"c9","type":"error"}'),
    (Ack(command_id="c1", ok=False, error="e"), '{"command_id":"c1","ok":false,"error":"e","type":"ack"}'),
    (
        EngineStateReport(engine=EngineState(name="llama.cpp", version="b1", status="absent")),
        '{"engine":{"name":"llama.cpp","version":"b1","status":"absent","detail":"","reported_version":"",'
        '"binary":""},"type":"engine_state"}',
    ),
    (
        ReplicaStateReport(replica=STATE),
        '{"shard":{"shard_id":"tiny-0","status":"ready","detail":"ok","port":8101,"pid":42,"restarts":1,'
        '"last_lines":["l"],"rss_mib":812,"vram_mib":4096},"type":"shard_state"}',
    ),
    (
        ReplicaStateReport(replica=ReplicaState(replica_id="s", status="draining")),
        '{"shard":{"shard_id":"s","status":"draining","detail":"","port":0,"pid":0,"restarts":0,'
        '"last_lines":[]},"type":"shard_state"}',
    ),
    (
        SetEngines(id="c2", fencing_token=3, engines=[EngineSpec("llama.cpp", "b1", "http://m/{version}")]),
        '{"id":"c2","fencing_token":3,"engines":[{"name":"llama.cpp","version":"b1",'
        '"release_api":"http://m/{version}"}],"type":"set_engines"}',
    ),
    (
        StartReplica(id="c3", fencing_token=3, replica=SPEC),
        '{"id":"c3","fencing_token":3,"shard":{"shard_id":"tiny-0","engine":"llama.cpp","engine_version":"b1",'
        '"weights":{"url":"http://m/w.gguf","sha256":"' + "ab" * 32 + '","size":300},"port":8101,'
        '"api_key":"sk","args":["-c","1024"],"env":{"A":"1"},"start_timeout_s":60.5,"max_restarts":2,'
        '"model_dir":"hub:o/n","devices":[0,1],"adapters":[{"name":"sql","weights":{"url":"http://m/w.gguf",'
        '"sha256":"' + "ab" * 32 + '","size":300}}]},"type":"start_shard"}',
    ),
    (
        StartReplica(
            id="c3",
            fencing_token=3,
            replica=ReplicaSpec(replica_id="t", engine="vllm", engine_version="1", weights=None, port=1, api_key="k"),
        ),
        '{"id":"c3","fencing_token":3,"shard":{"shard_id":"t","engine":"vllm","engine_version":"1","weights":null,'
        '"port":1,"api_key":"k","args":[],"env":{},"start_timeout_s":120.0,"max_restarts":5,"model_dir":""},'
        '"type":"start_shard"}',
    ),
    (
        StopReplica(id="c4", fencing_token=3, replica_id="tiny-0", grace_s=2.0),
        '{"id":"c4","fencing_token":3,"shard_id":"tiny-0","grace_s":2.0,"type":"stop_shard"}',
    ),
    (
        DrainReplica(id="c5", fencing_token=3, replica_id="tiny-0", timeout_s=30.0),
        '{"id":"c5","fencing_token":3,"shard_id":"tiny-0","timeout_s":30.0,"type":"drain_shard"}',
    ),
    (
        SetAdapters(
            id="a1",
            fencing_token=2,
            replica_id="tiny-0",
            adapters=[
                AdapterSpec(
                    name="support-bot", weights=WeightsSpec(url="/models/lora/support", sha256="cd" * 32, size=1024)
                )
            ],
        ),
        '{"id":"a1","fencing_token":2,"shard_id":"tiny-0","adapters":[{"name":"support-bot","weights":'
        '{"url":"/models/lora/support","sha256":"' + "cd" * 32 + '","size":1024}}],"type":"set_adapters"}',
    ),
    (
        SetAdapters(id="a2", fencing_token=2, replica_id="tiny-0", adapters=[]),
        '{"id":"a2","fencing_token":2,"shard_id":"tiny-0","adapters":[],"type":"set_adapters"}',
    ),
    (
        RemoveWeights(id="c6", fencing_token=3, sha256=["ab" * 32]),
        '{"id":"c6","fencing_token":3,"sha256":["' + "ab" * 32 + '"],"type":"remove_weights"}',
    ),
    (
        GetReplicaLogs(id="l1", replica_id="tiny-0", lines=50, cursor="1:2"),
        '{"id":"l1","shard_id":"tiny-0","lines":50,"cursor":"1:2","type":"get_shard_logs"}',
    ),
    (
        GetReplicaLogs(id="l1", replica_id="tiny-0"),
        '{"id":"l1","shard_id":"tiny-0","lines":100,"cursor":"","type":"get_shard_logs"}',
    ),
    (
        ReplicaLogsReply(in_reply_to="l1", replica_id="tiny-0", found=True, lines=["x"], cursor="1:9"),
        '{"in_reply_to":"l1","shard_id":"tiny-0","found":true,"lines":["x"],"cursor":"1:9","type":"shard_logs"}',
    ),
    # Added after v1 was published, sent only to a node whose hello names trace_context.
    (
        Hello(
            protocol_version=1,
            node_id="n",
            join_token="j",
            facts=FACTS,
            engines=[],
            replicas=[],
            features=["trace_context"],
        ),
        None,
    ),
    (
        SetEngines(id="c2", fencing_token=3, engines=[], traceparent=TRACEPARENT),
        '{"id":"c2","fencing_token":3,"engines":[],"traceparent":"' + TRACEPARENT + '","type":"set_engines"}',
    ),
    (
        StartReplica(
            id="c3",
            fencing_token=3,
            replica=ReplicaSpec(replica_id="t", engine="vllm", engine_version="1", weights=None, port=1, api_key="k"),
            traceparent=TRACEPARENT,
        ),
        '{"id":"c3","fencing_token":3,"shard":{"shard_id":"t","engine":"vllm","engine_version":"1","weights":null,'
        '"port":1,"api_key":"k","args":[],"env":{},"start_timeout_s":120.0,"max_restarts":5,"model_dir":""},'
        '"traceparent":"' + TRACEPARENT + '","type":"start_shard"}',
    ),
]


def _frozen(msg: Message, frame: str | None) -> str:
    """The sample's frame; the few too long to spell twice are derived from a spelled one."""
    if frame is not None:
        return frame
    full = json.loads(GOLDEN[0][1] or "")
    if isinstance(msg, Hello):
        features = ',"features":' + json.dumps(msg.features, separators=(",", ":")) if msg.features else ""
        return (
            '{"protocol_version":1,"node_id":"n","join_token":"j","facts":'
            + json.dumps(full["facts"], separators=(",", ":"))
            + ',"engines":[],"shards":[],"address":""'
            + features
            + ',"type":"hello"}'
        )
    return (
        '{"seq":8,"facts":null,"engines":'
        + json.dumps(full["engines"], separators=(",", ":"))
        + ',"shards":'
        + json.dumps(full["shards"], separators=(",", ":"))
        + ',"weights":'
        + json.dumps(full["weights"], separators=(",", ":"))
        + ',"type":"heartbeat"}'
    )


def test_every_message_type_has_a_golden_frame() -> None:
    assert {type(msg) for msg, _ in GOLDEN} == set(TAGS)


def test_the_v1_tags_are_unchanged() -> None:
    assert sorted(TAGS.values()) == [
        "ack",
        "drain_shard",
        "engine_state",
        "error",
        "get_shard_logs",
        "heartbeat",
        "hello",
        "refuse",
        "remove_weights",
        "set_adapters",
        "set_engines",
        "shard_logs",
        "shard_state",
        "start_shard",
        "stop_shard",
        "welcome",
    ]


@pytest.mark.parametrize(("msg", "frame"), GOLDEN, ids=[f"{TAGS[type(m)]}-{i}" for i, (m, _) in enumerate(GOLDEN)])
def test_a_message_encodes_to_its_frozen_frame_and_back(msg: Message, frame: str | None) -> None:
    text = _frozen(msg, frame)
    assert encode(msg) == text
    assert decode(text) == msg


# --------------------------------------------------------------------------- round trip, any message

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
_ID = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True)
_COUNT = st.integers(0, 2**30)
_TIME = st.floats(0, 2.0**33, allow_nan=False)
_STATUS = st.sampled_from(["pending", "downloading", "starting", "ready", "draining", "stopped", "failed"])
_SHA = st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
_CURSOR = st.from_regex(r"[0-9]{1,6}:[0-9]{1,6}", fullmatch=True) | st.just("")

_state = st.builds(
    ReplicaState,
    replica_id=_ID,
    status=_STATUS,
    detail=_TEXT,
    port=st.integers(0, 65535),
    pid=_COUNT,
    restarts=_COUNT,
    last_lines=st.lists(_TEXT, max_size=3),
    rss_mib=_COUNT,
    vram_mib=_COUNT,
)
_weights = st.builds(WeightsSpec, url=_TEXT, sha256=_SHA, size=_COUNT)
_spec = st.builds(
    ReplicaSpec,
    replica_id=_ID,
    engine=_TEXT,
    engine_version=_TEXT,
    weights=st.none() | _weights,
    port=st.integers(0, 65535),
    api_key=_TEXT,
    args=st.lists(_TEXT, max_size=3),
    env=st.dictionaries(_TEXT, _TEXT, max_size=2),
    start_timeout_s=_TIME,
    max_restarts=_COUNT,
    model_dir=_TEXT,
    devices=st.lists(st.integers(0, 16), max_size=3),
    adapters=st.lists(st.builds(AdapterSpec, name=_TEXT, weights=_weights), max_size=2),
)
_held = st.builds(WeightsHeld, sha256=_SHA, size=_COUNT, last_used=_TIME, in_use=st.booleans())

MESSAGES: st.SearchStrategy[Any] = st.one_of(
    st.builds(
        Hello,
        protocol_version=st.just(1),
        node_id=_ID,
        join_token=_TEXT,
        facts=st.just(FACTS),
        engines=st.just([ENGINE]),
        replicas=st.lists(_state, max_size=3),
        address=st.just("10.0.0.5"),
        weights=st.lists(_held, max_size=2),
        features=st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,31}", fullmatch=True), max_size=3),
    ),
    st.builds(
        Heartbeat,
        seq=_COUNT,
        facts=st.none() | st.just(FACTS),
        replicas=st.lists(_state, max_size=3),
        weights=st.none() | st.lists(_held, max_size=2),
    ),
    st.builds(ReplicaStateReport, replica=_state),
    st.builds(
        StartReplica,
        id=_TEXT,
        fencing_token=_COUNT,
        replica=_spec,
        traceparent=st.just("") | st.from_regex(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[0-3]", fullmatch=True),
    ),
    st.builds(StopReplica, id=_TEXT, fencing_token=_COUNT, replica_id=_ID, grace_s=_TIME),
    st.builds(DrainReplica, id=_TEXT, fencing_token=_COUNT, replica_id=_ID, timeout_s=_TIME),
    st.builds(GetReplicaLogs, id=_ID, replica_id=_ID, lines=st.integers(1, 1000), cursor=_CURSOR),
    st.builds(
        ReplicaLogsReply,
        in_reply_to=_TEXT,
        replica_id=_ID,
        found=st.booleans(),
        lines=st.lists(_TEXT, max_size=3),
        cursor=_CURSOR,
    ),
)


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


# The names an object can carry on the v1 wire for a replica; env keys are the engine's, not the wire's.
_V1_KEYS = {"shard", "shards", "shard_id"}


@settings(max_examples=200, deadline=None)
@given(msg=MESSAGES)
def test_any_message_round_trips_and_says_shard_on_the_wire(msg: Message) -> None:
    text = encode(msg)
    assert decode(text) == msg
    raw = json.loads(text)
    if isinstance(raw.get("shard"), dict):
        raw["shard"].pop("env", None)
    keys = _keys(raw)
    assert not any("replica" in k for k in keys), keys
    assert keys & _V1_KEYS, keys


def _parts(kind: type, seen: set[type]) -> set[type]:
    """``kind`` and every attrs class its fields hold, however nested (lists, unions)."""
    if kind in seen or not attrs.has(kind):
        return seen
    seen.add(kind)
    for field in attrs.fields(kind):
        for arg in (field.type, *getattr(field.type, "__args__", ())):
            for inner in (arg, *getattr(arg, "__args__", ())):
                if isinstance(inner, type):
                    _parts(inner, seen)
    return seen


def test_every_field_named_for_a_replica_travels_under_its_v1_key() -> None:
    # A field named replica_* left out of the converter's map would put "replica" on the wire.
    named = {
        kind
        for tag in TAGS
        for kind in _parts(tag, set())
        if any(wire.v1_key(f.name) != f.name for f in attrs.fields(kind))
    }
    assert named and named <= set(wire._V1_RENAMED)


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        (
            '{"id":"c","fencing_token":1,"engines":[],"traceparent":"00-zz","type":"set_engines"}',
            "not a W3C traceparent",
        ),
        (
            '{"id":"c","fencing_token":1,"engines":[],"traceparent":"' + "0" * 9000 + '","type":"set_engines"}',
            "not a W3C traceparent",
        ),
    ],
)
def test_a_command_with_a_malformed_traceparent_is_refused(frame: str, problem: str) -> None:
    with pytest.raises(wire.WireError, match=problem):
        decode(frame)


@pytest.mark.parametrize("features", [["Trace"], ["x" * 40], ["a"] * 33, ["a\n"]])
def test_a_hello_with_malformed_features_is_refused(features: list[str]) -> None:
    frame = json.loads(_frozen(GOLDEN[1][0], None))
    frame["features"] = features
    with pytest.raises(wire.WireError, match="feature"):
        decode(json.dumps(frame))
