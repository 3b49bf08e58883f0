"""The node <-> control wire protocol: JSON text frames, one attrs class per message type.

Every frame is a JSON object whose ``type`` names the message. One cattrs converter turns
messages into JSON and back. cattrs is lenient by default (it turns ``3`` into ``"3"`` for a
``str`` field and raises a bare ``KeyError`` on an unknown tag), and a wire protocol must not
be: a peer that sends the wrong shape gets one :class:`WireError` naming the field, which the
receiver can send back as an ``error`` frame instead of crashing.

The v1 wire spells replica "shard": the tags below and the keys ``shard_id``, ``shard`` and
``shards`` are what deployed peers read, so the classes say replica and the converter maps each
renamed field to its v1 key (``v1_key``).

Direction of each message:

* node -> control: ``hello``, ``heartbeat``, ``ack``, ``engine_state``, ``shard_state``,
  ``shard_logs``, ``error``
* control -> node: ``welcome``, ``refuse``, ``set_engines``, ``start_shard``, ``stop_shard``,
  ``drain_shard``, ``set_adapters``, ``remove_weights``, ``get_shard_logs``, ``heartbeat``,
  ``error``

About 750 lines: every message, its converter and the checks at the edge are the protocol's one
definition, kept together so that no message can be added without its bounds.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias, get_args

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.preconf.json import make_converter
from cattrs.strategies import configure_tagged_union

from llmgw_shared.config import json_kind as _json_kind
from llmgw_shared.config import strict_collections
from llmgw_shared.facts import GpuFacts, HostFacts
from llmgw_shared.jsonin import loads as _loads
from llmgw_shared.names import (
    BadName,
    check_address,
    check_asset_name,
    check_engine_name,
    check_node_id,
    check_replica_id,
    check_sha256,
    check_version,
)

PROTOCOL_VERSION = 1

# What a node names in its hello's ``features`` when it takes a ``traceparent`` on ``start_shard``
# and ``set_engines``: control sends the field only to such nodes, because a node that predates it
# refuses a frame with a key it does not know (every frame is strict), and the protocol version
# cannot change without every deployed control refusing every new node.
TRACE_CONTEXT = "trace_context"
# A W3C traceparent (version 00) as control's propagator writes it.
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
# A feature's name; a hello names at most this many (a newer node may name ones control ignores).
_FEATURE = re.compile(r"[a-z][a-z0-9_]{0,31}")
MAX_FEATURES = 32

# Part of a failed replica's detail when its port was taken by a process the node does not run:
# control then picks another port rather than backing the model off the node.
PORT_IN_USE = "is in use by another process"

# The llama.cpp release index used when an engine spec names no source of its own.
LLAMA_CPP_RELEASES = "https://api.github.com/repos/ggml-org/llama.cpp/releases/tags/{version}"


class WireError(ValueError):
    """A frame that is not a valid message; the text names what is wrong and where."""


# --------------------------------------------------------------------------- engines

# "unconfigured": an engine named by path (vLLM, SGLang) that this node's config does not name --
# not a failure, only something this node does not have; placement skips it without a word.
EngineStatus: TypeAlias = Literal["absent", "installing", "installed", "failed", "configured", "unconfigured"]


@attrs.frozen
class EngineSpec:
    """An engine control wants on a node: ``(name, version)`` and where its releases are listed.

    ``release_api`` is the URL of a GitHub-shaped release JSON (``{version}`` is substituted);
    empty means the engine's default source (GitHub for llama.cpp).
    """

    name: str
    version: str
    release_api: str = ""


@attrs.frozen
class AssetProvenance:
    """One archive an engine was unpacked from: where it was fetched, what it hashed to."""

    name: str
    url: str
    sha256: str  # hex, the digest the release index published and the download matched
    size: int


@attrs.frozen
class EngineProvenance:
    """Where an installed engine came from, as its install manifest records it."""

    # The release index it was chosen from (without any query string), and the sha256 of the
    # index's bytes as fetched: the index is what lists every archive's digest.
    source: str
    index_sha256: str
    assets: list[AssetProvenance]
    # Unix time the install was renamed into place.
    installed_at: float
    # The minisign key id that signed the index ("" when the node requires no signature).
    signed_by: str = ""
    # Who asked: the fencing token (the control leader's epoch) of the set_engines that asked
    # for it; 0 when it was installed by hand (``llmgw-node engines install``).
    control_epoch: int = 0
    # Whether the archives are kept beside the install, so ``engines check`` can hash them again.
    archives_kept: bool = False
    # The GPU backend the build carries and its proof saw ("cuda", "rocm", "vulkan", "cpu"); ""
    # from installs that predate it. Left out of the frame at "" like every field added later.
    backend: str = ""
    # Where its GPU runtime libraries came from: "cudart archive <name>", "wheels <name>==<ver>,
    # ...", "OS packages"; "" when the build needs none.
    runtime: str = ""

    def describe(self) -> str:
        """One line for people: the source, who signed, each archive's digest, when, who asked."""
        when = (
            datetime.fromtimestamp(self.installed_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            if self.installed_at > 0
            else "at an unknown time"
        )
        assets = ", ".join(f"{a.name} sha256:{a.sha256[:16]}…" for a in self.assets) or "no archives recorded"
        asked = f"control epoch {self.control_epoch}" if self.control_epoch else "by hand"
        signed = f"signed by {self.signed_by}" if self.signed_by else "unsigned index"
        kept = "; archives kept" if self.archives_kept else ""
        backend = f"{self.backend} build; " if self.backend else ""
        runtime = f"; runtime from {self.runtime}" if self.runtime else ""
        return f"{backend}from {self.source or '?'} ({signed}): {assets}{runtime}; installed {when}, {asked}{kept}"


@attrs.frozen
class EngineState:
    name: str
    version: str
    status: EngineStatus
    # The node's own words for what is happening: "downloading llama-...tar.gz (6 MB, 41%)",
    # or the reason for a failure.
    detail: str = ""
    # The version line the binary printed for ``--version`` once proven.
    reported_version: str = ""
    binary: str = ""
    # For an installed engine: where it came from (null for configured engines and before an
    # install). Left out of the frame when null, so a control that predates it still decodes
    # the states of engines that have none.
    provenance: EngineProvenance | None = None

    def describe(self) -> str:
        """One line for people: ``installing: downloading ...``, ``installed b11312``, ..."""
        if self.status in ("installing", "failed"):
            return f"{self.status}: {self.detail}" if self.detail else self.status
        if self.status in ("installed", "configured"):
            return f"{self.status} {self.version}"
        if self.status == "unconfigured":
            return "not configured here"
        return self.status


# --------------------------------------------------------------------------- replicas

WireReplicaStatus: TypeAlias = Literal["pending", "downloading", "starting", "ready", "draining", "stopped", "failed"]


@attrs.frozen
class WeightsSpec:
    """A model file: an http(s) URL or a local path, its size in bytes and its sha256 (hex)."""

    url: str
    sha256: str
    size: int


@attrs.frozen
class AdapterSpec:
    """A LoRA adapter the engine loads beside its model: its file is fetched and verified exactly
    as the weights are (for vLLM, ``weights.url`` is the adapter's directory on the node)."""

    name: str
    weights: WeightsSpec


@attrs.frozen
class ReplicaSpec:
    replica_id: str
    engine: str
    engine_version: str
    # One sha256-checked file (llama.cpp's GGUF), or None when ``model_dir`` names the model.
    weights: WeightsSpec | None
    port: int
    # The engine must require this key; the gateway sends it. Never logged (kept out of repr).
    api_key: str = attrs.field(repr=False)
    args: list[str] = attrs.field(factory=list)
    env: dict[str, str] = attrs.field(factory=dict)
    # Seconds the engine gets to answer its health endpoint before the start counts as failed.
    start_timeout_s: float = 120.0
    # Crash restarts before the replica is left failed.
    max_restarts: int = 5
    # A model directory for vLLM and SGLang: an absolute path on the node, or
    # "hub:ORG/NAME[@REVISION]" (a snapshot in the node's Hugging Face cache). The node checks it
    # against its model roots before anything is started.
    model_dir: str = ""
    # The GPUs (nvidia-smi indices, as the node's facts list them) the engine runs on: it is
    # started with CUDA_VISIBLE_DEVICES set to them, and split over them when there are several.
    # Empty: the node's default (no GPU, or whatever the engine finds).
    devices: list[int] = attrs.field(factory=list)
    # LoRA adapters, in the order the engine loads them (llama-server's requests name them by
    # this position; the gateway's ``lora`` field follows the same order).
    adapters: list[AdapterSpec] = attrs.field(factory=list)


@attrs.frozen
class ReplicaState:
    replica_id: str
    status: WireReplicaStatus
    detail: str = ""
    port: int = 0
    pid: int = 0
    restarts: int = 0
    # The engine's last output lines, sent with a failure so the operator sees why.
    last_lines: list[str] = attrs.field(factory=list)
    # Memory the engine's process tree uses, as measured on the node (0: not measured yet):
    # resident set size from /proc, and GPU memory from nvidia-smi's per-process accounting.
    # Control accounts a node's free memory from these once a replica runs.
    rss_mib: int = 0
    vram_mib: int = 0
    # The LoRA adapters the engine has loaded now, by name (in the spec's order): the gateway
    # sends an adapter's requests only to replicas that have it.
    adapters: list[str] = attrs.field(factory=list)

    def describe(self) -> str:
        return f"{self.status}: {self.detail}" if self.detail else self.status


@attrs.frozen
class WeightsHeld:
    """A model file in a node's weights cache: what control's weights GC decides on."""

    sha256: str
    size: int
    # Unix time a replica last started on it or stopped using it (the file's mtime on the node).
    last_used: float
    # A replica on the node uses it now (so it is used now, whatever last_used says): never removed.
    in_use: bool = False


# --------------------------------------------------------------------------- commands (control -> node)


@attrs.frozen
class SetEngines:
    """The complete list of engines this node should have; others are left installed but unused."""

    id: str
    fencing_token: int
    engines: list[EngineSpec]
    # Control's command span, the parent of the node's install spans ("": none; TRACE_CONTEXT).
    traceparent: str = ""


@attrs.frozen
class StartReplica:
    id: str
    fencing_token: int
    replica: ReplicaSpec
    # Control's command span, the parent of the node's replica start spans ("": none; TRACE_CONTEXT).
    traceparent: str = ""


@attrs.frozen
class StopReplica:
    id: str
    fencing_token: int
    replica_id: str
    grace_s: float = 10.0


@attrs.frozen
class DrainReplica:
    id: str
    fencing_token: int
    replica_id: str
    # How long in-flight requests may take before the engine is stopped anyway.
    timeout_s: float = 300.0


@attrs.frozen
class SetAdapters:
    """The complete list of LoRA adapters a running replica should have loaded, for engines that
    load and unload them live (vLLM): the node loads what is new and unloads what is gone, without
    restarting the engine, and reports what is loaded in the replica's state."""

    id: str
    fencing_token: int
    replica_id: str
    adapters: list[AdapterSpec]


@attrs.frozen
class RemoveWeights:
    id: str
    fencing_token: int
    # sha256 of each file to delete; files a running replica still uses are kept.
    sha256: list[str]


Command: TypeAlias = SetEngines | StartReplica | StopReplica | DrainReplica | SetAdapters | RemoveWeights

# Output lines one get_shard_logs may ask for (the node's ring answers at most this many, too).
MAX_LOG_LINES = 1000
# A cursor is "<inode>:<offset>", two numbers of at most 20 digits.
MAX_CURSOR = 41


@attrs.frozen
class GetReplicaLogs:
    """A request for a replica's last output lines; the node answers ``shard_logs``, never an ack.

    Not a command: it changes nothing, so it carries no fencing token and a standby's or an old
    leader's request is answered as well. ``cursor`` is the one a previous answer gave: only
    lines written after it are sent (a follower's poll).
    """

    id: str
    replica_id: str
    lines: int = 100
    cursor: str = ""


@attrs.frozen
class ReplicaLogsReply:
    in_reply_to: str
    replica_id: str
    # False: the node has no output of that replica (never ran here, or forgotten).
    found: bool
    lines: list[str] = attrs.field(factory=list)
    cursor: str = ""


@attrs.frozen
class Ack:
    command_id: str
    ok: bool
    error: str = ""


# --------------------------------------------------------------------------- state reports (node -> control)


@attrs.frozen
class EngineStateReport:
    engine: EngineState


@attrs.frozen
class ReplicaStateReport:
    replica: ReplicaState


# --------------------------------------------------------------------------- connection


@attrs.frozen
class Hello:
    protocol_version: int
    node_id: str
    join_token: str = attrs.field(repr=False)
    facts: HostFacts
    engines: list[EngineState]
    replicas: list[ReplicaState]
    # Where engines on this node are reachable (host or IP), from the node's config.
    address: str = ""
    # The model files in its weights cache (left out of the frame when empty).
    weights: list[WeightsHeld] = attrs.field(factory=list)
    # What this node takes beyond version 1 as published (TRACE_CONTEXT); absent: nothing.
    features: list[str] = attrs.field(factory=list)


@attrs.frozen
class Welcome:
    protocol_version: int
    # Seconds between heartbeats control expects; the node sends at this interval.
    heartbeat_interval_s: float = 5.0


@attrs.frozen
class Refuse:
    reason: str
    # A standby names the leader it knows of so the node can go there directly.
    leader: str = ""


@attrs.frozen
class Heartbeat:
    """Liveness plus only what changed since the previous heartbeat (empty lists: nothing did)."""

    seq: int
    facts: HostFacts | None = None
    engines: list[EngineState] = attrs.field(factory=list)
    replicas: list[ReplicaState] = attrs.field(factory=list)
    # The whole weights cache when it changed since the last report (null: unchanged).
    weights: list[WeightsHeld] | None = None


@attrs.frozen
class Error:
    message: str
    # The id of the command this answers, when there was one.
    in_reply_to: str = ""


Message: TypeAlias = (
    Hello
    | Welcome
    | Refuse
    | Heartbeat
    | Error
    | Ack
    | EngineStateReport
    | ReplicaStateReport
    | SetEngines
    | StartReplica
    | StopReplica
    | DrainReplica
    | SetAdapters
    | RemoveWeights
    | GetReplicaLogs
    | ReplicaLogsReply
)

TAGS: dict[type, str] = {
    Hello: "hello",
    Welcome: "welcome",
    Refuse: "refuse",
    Heartbeat: "heartbeat",
    Error: "error",
    Ack: "ack",
    EngineStateReport: "engine_state",
    ReplicaStateReport: "shard_state",
    SetEngines: "set_engines",
    StartReplica: "start_shard",
    StopReplica: "stop_shard",
    DrainReplica: "drain_shard",
    SetAdapters: "set_adapters",
    RemoveWeights: "remove_weights",
    GetReplicaLogs: "get_shard_logs",
    ReplicaLogsReply: "shard_logs",
}
_BY_TAG: dict[str, type] = {tag: cls for cls, tag in TAGS.items()}
assert set(TAGS) == set(get_args(Message))


# --------------------------------------------------------------------------- the converter


def _strict(kind: type, name: str) -> Any:
    def hook(value: Any, _: Any) -> Any:
        # bool is an int subclass in Python but not in JSON: refuse true where a number belongs.
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {name}, got a boolean")
        if kind is float and isinstance(value, int):
            return float(value)
        if not isinstance(value, kind):
            raise TypeError(f"expected {name}, got {_json_kind(value)}")
        return value

    return hook


def v1_key(name: str) -> str:
    """The key a field travels under: the v1 wire spells replica "shard" (``replica_id`` is
    ``shard_id``, ``replicas`` is ``shards``), as deployed nodes and controls read it."""
    return name.replace("replica", "shard")


def _v1_keys(kind: type) -> dict[str, Any]:
    """cattrs overrides that give each of ``kind``'s fields named for a replica its v1 key."""
    return {f.name: override(rename=v1_key(f.name)) for f in attrs.fields(kind) if v1_key(f.name) != f.name}


# Every message (or part of one) with a field named for a replica, parts before the messages that
# hold them (a message's hook is generated from the hooks registered when it is); a test checks
# that none is missed.
_V1_RENAMED: tuple[type, ...] = (
    ReplicaSpec,
    ReplicaState,
    StartReplica,
    StopReplica,
    DrainReplica,
    GetReplicaLogs,
    ReplicaLogsReply,
    ReplicaStateReport,
    SetAdapters,
    Hello,
    Heartbeat,
)
# A field in the path of a cattrs error (``$(start_shard).replica.port``), named in Python's words.
_PYTHON_FIELD = re.compile(r"\.(\w*replica\w*)")


def _make_converter() -> cattrs.Converter:
    conv = make_converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook(str, _strict(str, "a string"))
    conv.register_structure_hook(int, _strict(int, "an integer"))
    conv.register_structure_hook(float, _strict(float, "a number"))
    conv.register_structure_hook(bool, _strict(bool, "a boolean"))
    strict_collections(conv)
    # Before the union: its members' hooks are generated from what is registered at this point.
    for kind in _V1_RENAMED:
        conv.register_structure_hook(kind, make_dict_structure_fn(kind, conv, **_v1_keys(kind)))
    conv.register_unstructure_hook(
        EngineProvenance,
        make_dict_unstructure_fn(
            EngineProvenance, conv, backend=override(omit_if_default=True), runtime=override(omit_if_default=True)
        ),
    )
    conv.register_unstructure_hook(
        EngineState, make_dict_unstructure_fn(EngineState, conv, provenance=override(omit_if_default=True))
    )
    # Fields added since protocol version 1 was published stay out of a frame at their default,
    # so a peer that predates them still decodes everything that does not use them.
    omit = override(omit_if_default=True)
    conv.register_unstructure_hook(
        ReplicaState,
        make_dict_unstructure_fn(
            ReplicaState, conv, rss_mib=omit, vram_mib=omit, adapters=omit, **_v1_keys(ReplicaState)
        ),
    )
    conv.register_unstructure_hook(
        ReplicaSpec, make_dict_unstructure_fn(ReplicaSpec, conv, devices=omit, adapters=omit, **_v1_keys(ReplicaSpec))
    )
    conv.register_unstructure_hook(
        HostFacts,
        make_dict_unstructure_fn(
            HostFacts, conv, gpu_backend=omit, gpu_backends=omit, gpus_unusable=omit, degraded=omit
        ),
    )
    conv.register_unstructure_hook(
        Hello, make_dict_unstructure_fn(Hello, conv, weights=omit, features=omit, **_v1_keys(Hello))
    )
    conv.register_unstructure_hook(
        Heartbeat, make_dict_unstructure_fn(Heartbeat, conv, weights=omit, **_v1_keys(Heartbeat))
    )
    conv.register_unstructure_hook(
        StartReplica, make_dict_unstructure_fn(StartReplica, conv, traceparent=omit, **_v1_keys(StartReplica))
    )
    conv.register_unstructure_hook(SetEngines, make_dict_unstructure_fn(SetEngines, conv, traceparent=omit))
    for kind in _V1_RENAMED[3:-2]:  # the five above have omitted defaults too
        conv.register_unstructure_hook(kind, make_dict_unstructure_fn(kind, conv, **_v1_keys(kind)))
    configure_tagged_union(Message, conv, tag_generator=TAGS.__getitem__, tag_name="type")
    return conv


converter = _make_converter()


def _format(exc: BaseException, type_: type | None) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown field(s) {', '.join(sorted(exc.extra_fields))}"
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, cattrs.errors.CattrsError) and " not in literal " in str(exc):
        value, _, allowed = str(exc).partition(" not in literal ")
        return f"{value!r} is not one of {allowed.removeprefix('typing.Literal')}"
    if isinstance(exc, TypeError | ValueError | cattrs.errors.CattrsError) and str(exc):
        return str(exc)
    return cattrs.v.format_exception(exc, type_)


# --------------------------------------------------------------------------- what a node may say

# A node's reports are stored, logged, shown on the dashboard and turned into metric labels,
# URLs and file names, so each name in them is checked here, at the edge, against its kind's
# pattern (llmgw_shared.names), and everything else is bounded: a hello once welcomed a node id
# of 10,000 characters, with a newline, with NUL, or '../..'.
MAX_TEXT = 8192  # characters in any other string (a failure's detail, an engine's output line)
MAX_ITEMS = 1000  # entries in any list (engines, replicas, CPU flags, output lines)
MAX_INT = 2**62  # what the store keeps as a BIGINT, with room to add

_NAMES: dict[tuple[type, str], Callable[[Any], object]] = {
    (Hello, "node_id"): check_node_id,
    (Hello, "address"): lambda value: value == "" or check_address(value),
    (Hello, "features"): lambda value: _check_features(value),
    (EngineState, "name"): check_engine_name,
    (EngineState, "version"): lambda value: check_version(value, "engine version"),
    (ReplicaState, "replica_id"): check_replica_id,
    (ReplicaLogsReply, "replica_id"): check_replica_id,
    (ReplicaLogsReply, "cursor"): lambda value: _check_cursor(value),
    # Shown by `ctl engines` and the dashboard: an archive name and digests of their kinds ("" for
    # a digest a manifest from before provenance did not record).
    (AssetProvenance, "name"): check_asset_name,
    (AssetProvenance, "sha256"): lambda value: value == "" or check_sha256(value),
    (EngineProvenance, "index_sha256"): lambda value: value == "" or check_sha256(value),
    (WeightsHeld, "sha256"): check_sha256,
}
_PORTS = frozenset({(ReplicaState, "port")})
# A measured memory figure above this is not a measurement: 2^30 MiB is an exbibyte, more than
# any host has; the bound keeps a hostile report from turning into negative free memory.
MAX_MEMORY_MIB = 2**30
_MEMORY = frozenset({(ReplicaState, "rss_mib"), (ReplicaState, "vram_mib")})
# A Unix time after 2^33 s (the year 2242) is not a clock reading; bounded so that turning it into
# a date for the admin API cannot overflow.
MAX_UNIX_TIME = float(2**33)
_TIMES = frozenset({(WeightsHeld, "last_used")})
_FROM_NODES = (Hello, Heartbeat, Ack, EngineStateReport, ReplicaStateReport, ReplicaLogsReply, Error)


def _check_features(value: list[str]) -> None:
    if len(value) > MAX_FEATURES:
        raise BadName(f"{len(value)} features are more than {MAX_FEATURES}")
    for name in value:
        if not _FEATURE.fullmatch(name):
            raise BadName(f"{name[:40]!r} is not a feature name")


def _check_traceparent(msg: StartReplica | SetEngines, tag: str) -> None:
    """A command's traceparent is W3C's or empty: the node hands it to its tracer's propagator."""
    if msg.traceparent and not _TRACEPARENT.fullmatch(msg.traceparent):
        raise WireError(f"{msg.traceparent[:60]!r} is not a W3C traceparent @ $({tag}).traceparent")


def _check_cursor(value: str) -> None:
    if len(value) > MAX_CURSOR or not all(c.isdigit() or c == ":" for c in value):
        raise BadName(f"a log cursor is '<inode>:<offset>', not {value[:60]!r}")


def _check_log_request(msg: GetReplicaLogs) -> None:
    """Control's request names a log file and a count: both are checked before the node reads."""
    try:
        check_replica_id(msg.replica_id)
        _check_cursor(msg.cursor)
    except BadName as exc:
        raise WireError(f"{exc} @ $(get_shard_logs)") from None
    if not 1 <= msg.lines <= MAX_LOG_LINES:
        raise WireError(f"lines {msg.lines} is not between 1 and {MAX_LOG_LINES} @ $(get_shard_logs).lines")
    if len(msg.id) > 64:
        raise WireError("an id of more than 64 characters @ $(get_shard_logs).id")


def _check_report(value: Any, path: str) -> None:
    """Every field of an attrs value from a node: its name pattern if it has one, else the bounds."""
    kind = type(value)
    for field in attrs.fields(kind):
        item = getattr(value, field.name)
        where = f"{path}.{v1_key(field.name)}"
        check = _NAMES.get((kind, field.name))
        if check is not None:
            try:
                check(item)
            except BadName as exc:
                raise WireError(f"{exc} @ {where}") from None
        if (kind, field.name) in _PORTS and not 0 <= item <= 65535:
            raise WireError(f"port {item} is not between 0 and 65535 @ {where}")
        if (kind, field.name) in _TIMES and not 0 <= item <= MAX_UNIX_TIME:
            raise WireError(f"{item} is not a Unix time between 0 and 2^33 @ {where}")
        if (kind, field.name) in _MEMORY and not 0 <= item <= MAX_MEMORY_MIB:
            raise WireError(f"{item if abs(item) < 10**20 else 'a number'} MiB is not between 0 and 2^30 @ {where}")
        _check_bounds(item, where)


def check_from_node(value: Any, where: str = "$") -> None:
    """What ``decode`` checks in a node's message, for a part of one (``WireError`` naming the field).

    A node runs it on what it reads back from its own files before reporting it: a report control
    would refuse must not be sent (it would say nothing else either).
    """
    _check_report(value, where)


def _check_bounds(item: Any, where: str) -> None:
    if isinstance(item, str):
        if len(item) > MAX_TEXT:
            raise WireError(f"a string of {len(item)} characters is longer than {MAX_TEXT} @ {where}")
    elif isinstance(item, bool) or item is None:
        return
    elif isinstance(item, int):
        if not 0 <= item <= MAX_INT:
            raise WireError(f"{item if abs(item) < 10**20 else 'a number'} is not between 0 and 2^62 @ {where}")
    elif isinstance(item, float):
        if not math.isfinite(item) or item < 0:
            raise WireError(f"{item} is not a finite number of 0 or more @ {where}")
    elif isinstance(item, list | dict):
        if len(item) > MAX_ITEMS:
            raise WireError(f"{len(item)} entries are more than {MAX_ITEMS} @ {where}")
        entries = item.items() if isinstance(item, dict) else enumerate(item)
        for key, element in entries:
            if isinstance(key, str):
                _check_bounds(key, f"{where}.{key[:40]}")
            _check_bounds(element, f"{where}[{key!r}]" if isinstance(key, int) else f"{where}.{key[:40]}")
    elif attrs.has(type(item)):
        _check_report(item, where)


def encode(msg: Message) -> str:
    """One JSON text frame for ``msg``."""
    if type(msg) not in TAGS:
        raise WireError(f"not a wire message: {type(msg).__name__}")
    return json.dumps(converter.unstructure(msg, unstructure_as=Message), separators=(",", ":"))


def decode(text: str | bytes) -> Message:
    """Parse one frame; any problem is a :class:`WireError` whose text names the field."""
    try:
        # Depth-bounded: a frame nested 100,000 deep once ended a node's session with a traceback.
        raw = _loads(text)
    except ValueError as exc:  # UnicodeDecodeError and JsonTooDeep included
        raise WireError(f"frame is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise WireError(f"frame must be a JSON object, got {_json_kind(raw)}")
    tag = raw.get("type")
    if tag is None:
        raise WireError("frame has no 'type' field")
    if not isinstance(tag, str) or tag not in _BY_TAG:
        shown = repr(tag) if len(repr(tag)) <= 60 else repr(tag)[:57] + "..."
        raise WireError(f"unknown message type {shown}; known: {', '.join(sorted(_BY_TAG))}")
    try:
        msg: Message = converter.structure(raw, Message)  # type: ignore[arg-type]
    except Exception as exc:  # cattrs raises exception groups; render every leaf with its path
        problems = cattrs.transform_error(exc, path=f"$({tag})", format_exception=_format)
        # cattrs names the path by the Python fields; the peer reads it in the wire's keys.
        problems = [_PYTHON_FIELD.sub(lambda m: "." + v1_key(m.group(1)), p) for p in problems]
        # Cut: the text goes back to the peer in an error frame, which it bounds (MAX_TEXT) too.
        raise WireError("; ".join(problems)[:2000]) from None
    if isinstance(msg, _FROM_NODES):
        _check_report(msg, f"$({tag})")
    elif isinstance(msg, GetReplicaLogs):
        _check_log_request(msg)
    elif isinstance(msg, StartReplica | SetEngines):
        _check_traceparent(msg, tag)
    return msg


__all__ = [
    "LLAMA_CPP_RELEASES",
    "MAX_LOG_LINES",
    "MAX_MEMORY_MIB",
    "PROTOCOL_VERSION",
    "TRACE_CONTEXT",
    "Ack",
    "AdapterSpec",
    "AssetProvenance",
    "Command",
    "DrainReplica",
    "EngineProvenance",
    "EngineSpec",
    "EngineState",
    "EngineStateReport",
    "EngineStatus",
    "Error",
    "GetReplicaLogs",
    "GpuFacts",
    "Heartbeat",
    "Hello",
    "HostFacts",
    "Message",
    "Refuse",
    "RemoveWeights",
    "ReplicaLogsReply",
    "ReplicaSpec",
    "ReplicaState",
    "ReplicaStateReport",
    "SetAdapters",
    "SetEngines",
    "StartReplica",
    "StopReplica",
    "WeightsHeld",
    "WeightsSpec",
    "Welcome",
    "WireError",
    "WireReplicaStatus",
    "check_from_node",
    "converter",
    "decode",
    "encode",
    "v1_key",
]
