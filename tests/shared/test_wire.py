"""The wire protocol: every message round-trips, and every malformed frame is one readable WireError."""

from __future__ import annotations

import json

import pytest

from llmgw_shared.facts import GpuFacts, HostFacts, unprobed
from llmgw_shared.wire import (
    PROTOCOL_VERSION,
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
    WeightsSpec,
    Welcome,
    WireError,
    decode,
    encode,
)

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
    cpu_features=["avx", "avx2", "fma", "f16c"],
    ram_total_mib=24000,
    ram_available_mib=20000,
    data_dir="/var/lib/llmgw-node",
    disk_free_mib=80000,
    nvidia_driver="550.54.15",
    gpus=[GpuFacts(index=0, name="NVIDIA L4", uuid="GPU-1234", memory_total_mib=23034, memory_free_mib=22000)],
)
PROVENANCE = EngineProvenance(
    source="http://10.0.0.1:8443/releases/llama.cpp/b11312",
    index_sha256="cd" * 32,
    assets=[
        AssetProvenance(
            "llama-b11312-bin-ubuntu-x64.tar.gz",
            "http://10.0.0.1:8443/files/engines/llama-b11312-bin-ubuntu-x64.tar.gz",
            "ef" * 32,
            6_000_000,
        )
    ],
    installed_at=1790000000.25,
    signed_by="RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3",
    control_epoch=3,
    archives_kept=True,
)
SPEC = ReplicaSpec(
    replica_id="tiny-0",
    engine="llama.cpp",
    engine_version="b11312",
    weights=WeightsSpec(url="http://127.0.0.1:9/tiny.gguf", sha256="ab" * 32, size=300_000),
    port=8101,
    api_key="sk-shard-secret",
    args=["-c", "1024"],
    env={"GGML_X": "1"},
)

EXAMPLES: list[Message] = [
    Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id="gpu-1",
        join_token="llmgw-join-x",
        facts=FACTS,
        engines=[EngineState(name="llama.cpp", version="b11312", status="installed", reported_version="v")],
        replicas=[ReplicaState(replica_id="tiny-0", status="ready", port=8101, pid=42)],
        address="10.0.0.5",
    ),
    Hello(protocol_version=PROTOCOL_VERSION, node_id="n", join_token="t", facts=unprobed(), engines=[], replicas=[]),
    Welcome(protocol_version=PROTOCOL_VERSION, heartbeat_interval_s=2.5),
    Refuse(reason="standby", leader="ws://10.0.0.2:7070/agent/v1"),
    Heartbeat(seq=7),
    Heartbeat(
        seq=8, facts=FACTS, replicas=[ReplicaState(replica_id="s", status="failed", detail="x", last_lines=["a"])]
    ),
    Error(message="bad frame", in_reply_to="c9"),
    Ack(command_id="c1", ok=False, error="port 8101 is already used by replica x"),
    EngineStateReport(engine=EngineState(name="llama.cpp", version="b1", status="installing", detail="downloading")),
    # An installed engine's report carries its provenance: it must decode on control.
    EngineStateReport(
        engine=EngineState(
            name="llama.cpp",
            version="b11312",
            status="installed",
            reported_version="version: 1 (b11312)",
            binary="/x/llama-server",
            provenance=PROVENANCE,
        )
    ),
    ReplicaStateReport(replica=ReplicaState(replica_id="s", status="draining")),
    ReplicaStateReport(
        replica=ReplicaState(replica_id="s", status="ready", port=20000, pid=7, rss_mib=812, vram_mib=4096)
    ),
    ReplicaStateReport(
        replica=ReplicaState(
            replica_id="s", status="ready", detail="adapter x not loaded: HTTP 400", adapters=["bot", "support"]
        )
    ),
    SetEngines(id="c2", fencing_token=3, engines=[EngineSpec("llama.cpp", "b11312", "http://mirror/{version}")]),
    StartReplica(id="c3", fencing_token=3, replica=SPEC),
    StopReplica(id="c4", fencing_token=3, replica_id="tiny-0", grace_s=2.0),
    DrainReplica(id="c5", fencing_token=3, replica_id="tiny-0", timeout_s=30.0),
    SetAdapters(
        id="c7",
        fencing_token=3,
        replica_id="vllm-0",
        adapters=[AdapterSpec("bot", WeightsSpec("/models/bot", "cd" * 32, 4096))],
    ),
    RemoveWeights(id="c6", fencing_token=3, sha256=["ab" * 32]),
    GetReplicaLogs(id="logs1", replica_id="tiny-0", lines=50, cursor="1234:5678"),
    ReplicaLogsReply(
        in_reply_to="logs1", replica_id="tiny-0", found=True, lines=["main: server is listening"], cursor="1234:9000"
    ),
]


def test_every_message_type_has_an_example() -> None:
    assert {type(m) for m in EXAMPLES} == set(TAGS)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: TAGS[type(m)])
def test_round_trip(msg: Message) -> None:
    text = encode(msg)
    assert json.loads(text)["type"] == TAGS[type(msg)]
    assert decode(text) == msg


def test_optional_fields_default_when_absent() -> None:
    assert decode('{"type":"heartbeat","seq":1}') == Heartbeat(seq=1)
    assert decode('{"type":"stop_shard","id":"a","fencing_token":1,"shard_id":"s"}').grace_s == 10.0


def test_an_integer_is_accepted_for_a_float_field() -> None:
    msg = decode('{"type":"stop_shard","id":"a","fencing_token":1,"shard_id":"s","grace_s":3}')
    assert isinstance(msg, StopReplica) and msg.grace_s == 3.0 and isinstance(msg.grace_s, float)


def _start_frame(**replica_changes: object) -> str:
    frame = json.loads(encode(StartReplica(id="c3", fencing_token=3, replica=SPEC)))
    frame["shard"].update(replica_changes)
    return json.dumps(frame)


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ("not json", "frame is not valid JSON"),
        ("[1, 2]", "frame must be a JSON object, got a list"),
        ('{"id": "x"}', "frame has no 'type' field"),
        ('{"type": "launch_missiles"}', "unknown message type 'launch_missiles'"),
        ('{"type": 3}', "unknown message type 3"),
        ('{"type": "ack", "command_id": "x"}', "required field missing @ $(ack).ok"),
        ('{"type": "ack", "command_id": "x", "ok": true, "colour": 1}', "unknown field(s) colour @ $(ack)"),
        # cattrs on its own would turn 3 into "3": the protocol does not.
        (_start_frame(**{"shard_id": 3}), "expected a string, got a number @ $(start_shard).shard.shard_id"),
        (_start_frame(port="8101"), "expected an integer, got a string @ $(start_shard).shard.port"),
        (_start_frame(port=True), "expected an integer, got a boolean @ $(start_shard).shard.port"),
        (_start_frame(args="-c 1024"), "$(start_shard).shard.args"),
        (_start_frame(env={"A": 1}), "expected a string, got a number @ $(start_shard).shard.env['A']"),
        ('{"type":"ack","command_id":"x","ok":"yes"}', "expected a boolean, got a string @ $(ack).ok"),
        ('{"type":"shard_state","shard":{"shard_id":"s","status":"exploded"}}', "'exploded' is not one of"),
    ],
)
def test_malformed_frames_raise_one_readable_error(frame: str, expected: str) -> None:
    with pytest.raises(WireError) as info:
        decode(frame)
    assert expected in str(info.value)


def test_every_problem_in_a_frame_is_named() -> None:
    with pytest.raises(WireError) as info:
        decode(_start_frame(port="x", bogus=True, **{"shard_id": 1}))
    text = str(info.value)
    assert "shard.port" in text and "shard.shard_id" in text and "bogus" in text


def _installed(provenance: object) -> str:
    frame = json.loads(
        encode(EngineStateReport(engine=EngineState("llama.cpp", "b1", "installed", provenance=PROVENANCE)))
    )
    frame["engine"]["provenance"] = provenance
    return json.dumps(frame)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"assets": [{"name": "../../etc/passwd", "url": "", "sha256": "", "size": 1}]}, "provenance.assets[0].name"),
        ({"assets": [{"name": "a\nb", "url": "", "sha256": "", "size": 1}]}, "provenance.assets[0].name"),
        ({"assets": [{"name": "a.tgz", "url": "", "sha256": "not hex", "size": 1}]}, "provenance.assets[0].sha256"),
        ({"assets": [{"name": "a.tgz", "url": "", "sha256": "", "size": -1}]}, "provenance.assets[0].size"),
        ({"index_sha256": "x" * 64}, "provenance.index_sha256"),
        ({"source": "x" * 10_000}, "provenance.source"),
        ({"signed_by": "x" * 10_000}, "provenance.signed_by"),
        ({"installed_at": -1.0}, "provenance.installed_at"),
        ({"control_epoch": -3}, "provenance.control_epoch"),
        ({"assets": [{"name": "a.tgz", "url": "", "sha256": "", "size": 1}] * 1001}, "provenance.assets"),
    ],
)
def test_a_provenance_from_a_node_is_checked_like_every_report(change: dict[str, object], expected: str) -> None:
    raw = json.loads(
        encode(EngineStateReport(engine=EngineState("llama.cpp", "b1", "installed", provenance=PROVENANCE)))
    )["engine"]["provenance"]
    with pytest.raises(WireError) as info:
        decode(_installed({**raw, **change}))
    assert expected in str(info.value)


def test_an_engine_state_without_provenance_leaves_it_out_of_the_frame() -> None:
    # A control that predates provenance still decodes the states of engines that have none.
    assert "provenance" not in encode(EngineStateReport(engine=EngineState("llama.cpp", "b1", "absent")))
    assert decode(_installed(None)) == EngineStateReport(engine=EngineState("llama.cpp", "b1", "installed"))


def test_encode_refuses_what_is_not_a_message() -> None:
    with pytest.raises(WireError):
        encode(SPEC)  # type: ignore[arg-type]


def test_describe_uses_the_nodes_own_words() -> None:
    assert EngineState("llama.cpp", "b1", "installing", detail="downloading x (6 MB, 41%)").describe() == (
        "installing: downloading x (6 MB, 41%)"
    )
    assert EngineState("llama.cpp", "b1", "installed").describe() == "installed b1"
    assert EngineState("llama.cpp", "b1", "absent").describe() == "absent"


def test_secrets_stay_out_of_repr() -> None:
    assert "sk-shard-secret" not in repr(StartReplica(id="c", fencing_token=1, replica=SPEC))
    assert "llmgw-join-x" not in repr(EXAMPLES[0])


@pytest.mark.parametrize("field", ["rss_mib", "vram_mib"])
@pytest.mark.parametrize("value", [-1, 2**30 + 1, 2**62, 10**30])
def test_measured_memory_out_of_bounds_is_refused(field: str, value: int) -> None:
    frame = json.dumps({"type": "shard_state", "shard": {"shard_id": "s", "status": "ready", field: value}})
    with pytest.raises(WireError, match=f"shard.{field}"):
        decode(frame)
