"""Hostile frames for ``wire.decode``: whatever a peer sends, the answer is a message or one WireError.

Valid frames of every type are mutated at random places (a value replaced by another kind, a
huge number, a long or hostile string, JSON nested far too deep, a key added or removed), and
arbitrary bytes are thrown in too. Nothing may escape but WireError, and what decodes from a
node must hold only names of the expected shapes.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_shared.names import ASSET_NAME, ENGINE_NAME, NODE_ID, REPLICA_ID, SHA256
from llmgw_shared.wire import EngineState, EngineStateReport, Hello, ReplicaState, WireError, decode, encode

from .test_wire import EXAMPLES

FRAMES = [json.loads(encode(m)) for m in EXAMPLES]
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**30, max_value=10**60),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["", "../..", "a\nb", "a\x00b", "<b>", "x" * 10_000, "n1\n", "fe80::1%eth0", "h:1/p"]),
    st.integers(min_value=1, max_value=3000).map(lambda n: "DEEP" + str(n)),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _set(frame: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    container = frame
    for step in path[:-1]:
        container = container[step]
    container[path[-1]] = new
    return frame


def _text(frame: Any) -> str:
    text = json.dumps(frame)
    # A marker for nesting far past the limit, spliced in as text (json.dumps could not write it).
    for marker in sorted({part.split('"')[0] for part in text.split('"DEEP')[1:]}, key=len, reverse=True):
        depth = int(marker)
        text = text.replace(f'"DEEP{marker}"', "[" * depth + "]" * depth)
    return text


def _check_names(message: Any) -> None:
    if isinstance(message, Hello):
        assert NODE_ID.fullmatch(message.node_id)
    engines = message.engines if isinstance(message, Hello) else []
    if isinstance(message, EngineStateReport):
        engines = [message.engine]
    for engine in engines:
        assert isinstance(engine, EngineState) and ENGINE_NAME.fullmatch(engine.name)
        if engine.provenance is not None:
            for asset in engine.provenance.assets:
                assert ASSET_NAME.fullmatch(asset.name) and (asset.sha256 == "" or SHA256.fullmatch(asset.sha256))
    for replica in getattr(message, "shards", []) or []:
        assert isinstance(replica, ReplicaState) and REPLICA_ID.fullmatch(replica.replica_id)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(range(len(FRAMES))), st.data())
def test_a_mutated_frame_decodes_or_is_one_wire_error(index: int, data: st.DataObject) -> None:
    frame = json.loads(json.dumps(FRAMES[index]))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(frame)))
        action = data.draw(st.sampled_from(["replace", "add", "drop"]))
        if action == "replace":
            frame = _set(frame, path, data.draw(HOSTILE))
        elif action == "add" and isinstance(frame, dict):
            frame[data.draw(st.text(max_size=8))] = data.draw(HOSTILE)
        elif action == "drop" and path and isinstance(frame, dict) and path[0] in frame:
            del frame[path[0]]
    try:
        message = decode(_text(frame))
    except WireError as exc:
        assert len(str(exc)) <= 2000
        return
    _check_names(message)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_any_bytes_decode_or_are_one_wire_error(data: bytes | str) -> None:
    with contextlib.suppress(WireError):
        decode(data)


# --------------------------------------------------------------------------- engine logs (issue 19)


def test_log_requests_and_answers_are_bounded_and_named() -> None:
    from llmgw_shared.wire import MAX_LOG_LINES, GetReplicaLogs, ReplicaLogsReply

    ok = GetReplicaLogs(id="logs1", replica_id="tiny-0", lines=10, cursor="12:34")
    assert decode(encode(ok)) == ok
    answer = ReplicaLogsReply(in_reply_to="logs1", replica_id="tiny-0", found=True, lines=["a", "b"], cursor="1:2")
    assert decode(encode(answer)) == answer
    for bad in (
        {"type": "get_shard_logs", "id": "x", "shard_id": "../etc", "lines": 1},
        {"type": "get_shard_logs", "id": "x", "shard_id": "s", "lines": 0},
        {"type": "get_shard_logs", "id": "x", "shard_id": "s", "lines": MAX_LOG_LINES + 1},
        {"type": "get_shard_logs", "id": "x", "shard_id": "s", "lines": 1, "cursor": "1:2; rm"},
        {"type": "get_shard_logs", "id": "x" * 65, "shard_id": "s", "lines": 1},
        {"type": "shard_logs", "in_reply_to": "x", "shard_id": "a/b", "found": True},
        {"type": "shard_logs", "in_reply_to": "x", "shard_id": "s", "found": True, "lines": ["x" * 9000]},
        {"type": "shard_logs", "in_reply_to": "x", "shard_id": "s", "found": True, "lines": ["x"] * 1001},
        {"type": "shard_logs", "in_reply_to": "x", "shard_id": "s", "found": True, "cursor": "c" * 50},
    ):
        with pytest.raises(WireError):
            decode(json.dumps(bad))
