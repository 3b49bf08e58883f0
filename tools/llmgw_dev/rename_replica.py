"""Codemod for issue 33's vocabulary: "shard" becomes "replica" in Python, logs and docs, while the
v1 wire, the node's state file and the admin API keep the spellings deployed peers and clients use.

Run from anywhere inside the repository, as often as wanted (a second run changes nothing):

    python3 tools/llmgw_dev/rename_replica.py            # rewrite the tree, then print what it did
    python3 tools/llmgw_dev/rename_replica.py --check    # exit 1 when a run would change something

It is written to be run again on a newer tree (after other branches merged): every rule works on
what it finds, not on line numbers, and a hand fix it cannot find says so ("anchor not found")
instead of guessing. What it does, in order:

1. moves the modules whose names say shard (``git mv``);
2. applies context rules, where one spelling means two things (``reconciler.shards`` is control's
   records, ``node.shards`` a node's replicas; ``NodeView(shards=...)`` is an admin API field);
3. rewrites every Python, Markdown and dashboard file token by token:

   * identifiers: shard -> replica (case kept), with the specific names in ``NAMES``;
   * strings with no whitespace (JSON keys, wire tags, file names, secrets' names) are kept, but
     for class and constant names in them (``__all__``) and the code inside f-string braces;
   * prose (comments, docstrings, log and error text, Markdown): the words shard/shards become
     replica/replicas, except in quotes or backticks, beside ``/ - .`` (paths, JSON paths), and
     the wire's tags (``start_shard`` ...); the wire's own page keeps its code spellings;
4. applies the hand fixes (``FIXES``): exact rewrites where a rule above cannot know the meaning
   (wire.py's converter maps the renamed fields to their v1 keys, the state file too, ...).

Then it warns about names it would have merged (a function that has both ``shards`` and
``replicas``) so a person looks there.
"""

# The hand fixes quote source lines verbatim, some longer than the house's 120 columns.
# ruff: noqa: E501

from __future__ import annotations

import argparse
import ast
import fnmatch
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(
    subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
    ).stdout.strip()
)
SELF = "tools/llmgw_dev/rename_replica.py"
# Files about the spelling itself, which quote the kept "shard" lines verbatim.
LEAVE = {SELF, "tests/test_shard_spelling.py"}

# ----------------------------------------------------------------------------------------- names

MOVES = [
    ("llmgw_control/src/llmgw_control/fleet/shards.py", "llmgw_control/src/llmgw_control/fleet/replica_records.py"),
    ("llmgw_control/src/llmgw_control/fleet/shard_ids.py", "llmgw_control/src/llmgw_control/fleet/replica_ids.py"),
    ("llmgw_node/src/llmgw_node/shard_logs.py", "llmgw_node/src/llmgw_node/replica_logs.py"),
    ("tests/node/test_shard_logs.py", "tests/node/test_replica_logs.py"),
    ("tests/node/test_shards.py", "tests/node/test_replicas.py"),
]

# Names the generic rule (shard -> replica, case kept) would get wrong: a clash with a name that
# exists (admin's ReplicaLogs; the reconciler's published ``replicas``), or another word (router).
NAMES = {
    "ShardLogs": "ReplicaLogsReply",  # admin/api/schemas.py has ReplicaLogs (the API's answer)
    # The statuses a node may send, as the wire spells them; ReplicaStatus is the enum of
    # shared/src/llmgw_shared/replica_lifecycle.py (with control's own ``assigned``).
    "ShardStatus": "WireReplicaStatus",
    "RouterConfig": "GatewayConfig",
    "_sync_router": "_publish_to_gateway",
}
# Identifiers that say shard on purpose.
KEEP_NAMES = {"test_any_message_round_trips_and_says_shard_on_the_wire", "sharding"}

# What the v1 wire, the state file, the store and the admin API spell: never rewritten in a
# string or a code span, whatever else around them is.
V1_SPELLINGS = {
    "shard",
    "shards",
    "shard_id",
    "start_shard",
    "stop_shard",
    "drain_shard",
    "shard_state",
    "get_shard_logs",
    "shard_logs",
    "shard-api-keys",
    "shard-id",
    "shards.json",
}
# The wire's message tags, kept in prose too (a docstring naming the frame it answers).
WIRE_TAGS = {"start_shard", "stop_shard", "drain_shard", "shard_state", "get_shard_logs", "shard_logs"}
# Pages that document the wire's spellings: prose changes, code spans keep their snake_case.
WIRE_DOCS = {"docs/wire-protocol.md", "docs/node.md"}

# Paths and dotted module names of the moved modules, as text anywhere (docs, comments, imports).
PATHS = [
    (r"\bfleet/shards\.py\b", "fleet/replica_records.py"),
    (r"(?<![\w/.])shards\.py\b", "replica_records.py"),
    (r"\bshard_ids\.py\b", "replica_ids.py"),
    (r"\bshard_logs\.py\b", "replica_logs.py"),
    (r"\btest_shard_logs\.py\b", "test_replica_logs.py"),
    (r"\btest_shards\.py\b", "test_replicas.py"),
    (r"\bfleet\.shards\b", "fleet.replica_records"),
    (r"\bshards\.KEEP_ENDED\b", "replica_records.KEEP_ENDED"),
    (r"\bfrom \.shards import\b", "from .replica_records import"),
    (r"\bfrom \. import shards\b", "from . import replica_records"),
]


# (files, pattern, replacement or None to keep the match as it is). Applied before the token pass.
def _argnames(m: re.Match[str]) -> str:
    """pytest's parametrize names the test's parameters in a string: Python names."""
    return _WORD.sub(lambda w: ident(w.group(0)), m.group(0))


CONTEXT: list[tuple[str, str, str | Callable[[re.Match[str]], str] | None]] = [
    ("*.py", r"""parametrize\(\s*\(?(?:\s*["'][\w, ]*["']\s*,?)+""", _argnames),
    # The reconciler's records of the replicas it placed; ``replicas`` is the published set.
    ("*.py", r"\breconciler\.shards\b", "reconciler.records"),
    ("llmgw_control/src/llmgw_control/fleet/reconciler.py", r"\bself\.shards\b", "self.records"),
    ("tests/control/test_reconciler.py", r"\bsecond\.shards\b", "second.records"),
    ("tests/control/dashboard/test_fleet_metrics.py", r"SimpleNamespace\(shards=", "SimpleNamespace(records="),
    # The gauge of replicas per node, beside the gauge of replicas per model (``replicas``).
    ("llmgw_control/src/llmgw_control/fleet/metrics.py", r"(?<![.\w])shards\b", "node_replicas"),
    # The admin API's node answer: ``shards`` is a JSON field clients read.
    ("llmgw_control/src/llmgw_control/admin/api/schemas.py", r"^    shards: list\[", None),
    ("llmgw_control/src/llmgw_control/admin/*_views.py", r"\bshards=(?!=)", None),
    # The glossary says what the v1 wire calls a replica.
    ("docs/architecture.md", r"The wire's v1 spelling is \*shard\*", None),
    # The heartbeat's fields, by their v1 keys, in node.md's wire table.
    ("docs/node.md", r"engines, shards \(only those that changed\)", None),
    # Loggers are named after their module.
    ("*.py", r"""get_logger\(["']llmgw\.router[\w.]*["']\)""", "get_logger(__name__)"),
    ("*.py", r"""getLogger\(["']llmgw\.router[\w.]*["']\)""", "getLogger(__name__)"),
]

# ----------------------------------------------------------------------------------------- hand fixes
# (file, old, new): exact text, applied after the token pass. Each is idempotent (``new`` does not
# contain ``old``, or the rewrite is skipped once ``new`` is there); a missing anchor is reported.

WIRE = "shared/src/llmgw_shared/wire.py"
FIXES: list[tuple[str, str, str]] = [
    (
        WIRE,
        """    # Before the union: its members' hooks are generated from what is registered at this point.
""",
        """    # Before the union: its members' hooks are generated from what is registered at this point.
    for kind in _V1_RENAMED:
        conv.register_structure_hook(kind, make_dict_structure_fn(kind, conv, **_v1_keys(kind)))
""",
    ),
    (
        WIRE,
        """    conv.register_unstructure_hook(ReplicaState, make_dict_unstructure_fn(
        ReplicaState, conv, rss_mib=omit, vram_mib=omit, adapters=omit))
    conv.register_unstructure_hook(ReplicaSpec, make_dict_unstructure_fn(ReplicaSpec, conv, devices=omit,
                                                                      adapters=omit))
""",
        """    conv.register_unstructure_hook(ReplicaState, make_dict_unstructure_fn(
        ReplicaState, conv, rss_mib=omit, vram_mib=omit, adapters=omit, **_v1_keys(ReplicaState)))
    conv.register_unstructure_hook(ReplicaSpec, make_dict_unstructure_fn(
        ReplicaSpec, conv, devices=omit, adapters=omit, **_v1_keys(ReplicaSpec)))
""",
    ),
    (
        WIRE,
        """    conv.register_unstructure_hook(Hello, make_dict_unstructure_fn(Hello, conv, weights=omit))
    conv.register_unstructure_hook(Heartbeat, make_dict_unstructure_fn(Heartbeat, conv, weights=omit))
""",
        """    conv.register_unstructure_hook(Hello, make_dict_unstructure_fn(Hello, conv, weights=omit, **_v1_keys(Hello)))
    conv.register_unstructure_hook(Heartbeat, make_dict_unstructure_fn(
        Heartbeat, conv, weights=omit, **_v1_keys(Heartbeat)))
    for kind in _V1_RENAMED[2:-2]:  # the four above have omitted defaults too
        conv.register_unstructure_hook(kind, make_dict_unstructure_fn(kind, conv, **_v1_keys(kind)))
""",
    ),
    (
        WIRE,
        """def _make_converter() -> cattrs.Converter:
""",
        '''def v1_key(name: str) -> str:
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
    ReplicaSpec, ReplicaState, StartReplica, StopReplica, DrainReplica, GetReplicaLogs, ReplicaLogsReply,
    ReplicaStateReport, SetAdapters, Hello, Heartbeat,
)
# A field in the path of a cattrs error (``$(start_shard).replica.port``), named in Python's words.
_PYTHON_FIELD = re.compile(r"\\.(\\w*replica\\w*)")


def _make_converter() -> cattrs.Converter:
''',
    ),
    (WIRE, "import math\n", "import math\nimport re\n"),
    (
        WIRE,
        """        problems = cattrs.transform_error(exc, path=f"$({tag})", format_exception=_format)
""",
        """        problems = cattrs.transform_error(exc, path=f"$({tag})", format_exception=_format)
        # cattrs names the path by the Python fields; the peer reads it in the wire's keys.
        problems = [_PYTHON_FIELD.sub(lambda m: "." + v1_key(m.group(1)), p) for p in problems]
""",
    ),
    (
        WIRE,
        "from cattrs.gen import make_dict_unstructure_fn, override\n",
        "from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override\n",
    ),
    # The checks at the edge look fields up by their Python name, and say where by the wire's.
    (
        WIRE,
        """    (ReplicaState, "shard_id"): check_replica_id,
    (ReplicaLogsReply, "shard_id"): check_replica_id,
""",
        """    (ReplicaState, "replica_id"): check_replica_id,
    (ReplicaLogsReply, "replica_id"): check_replica_id,
""",
    ),
    (
        WIRE,
        """        where = f"{path}.{field.name}"
""",
        """        where = f"{path}.{v1_key(field.name)}"
""",
    ),
    (
        WIRE,
        """    "encode",
]
""",
        """    "encode",
    "v1_key",
]
""",
    ),
    (
        WIRE,
        """Direction of each message:
""",
        """The v1 wire spells replica "shard": the tags below and the keys ``shard_id``, ``shard`` and
``shards`` are what deployed peers read, so the classes say replica and the converter maps each
renamed field to its v1 key (``v1_key``).

Direction of each message:
""",
    ),
    # The node's state file is stored data: its records keep the v1 keys (the converter's own
    # hooks do the nested spec).
    (
        "llmgw_node/src/llmgw_node/procs.py",
        "from llmgw_shared.wire import ReplicaSpec, converter\n",
        "from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override\n\n"
        "from llmgw_shared.wire import ReplicaSpec, converter, v1_key\n",
    ),
    (
        "llmgw_node/src/llmgw_node/procs.py",
        """class StateFile:
""",
        """# The file a daemon of an earlier release wrote says "shard_id" (like the v1 wire): kept, so an
# upgraded daemon adopts what its predecessor recorded.
_STORED: dict[str, Any] = {"replica_id": override(rename=v1_key("replica_id"))}
_structure_record = make_dict_structure_fn(ProcessRecord, converter, **_STORED)
_unstructure_record = make_dict_unstructure_fn(ProcessRecord, converter, **_STORED)


class StateFile:
""",
    ),
    (
        "llmgw_node/src/llmgw_node/procs.py",
        "records.append(converter.structure(item, ProcessRecord))",
        "records.append(_structure_record(item, ProcessRecord))",
    ),
    (
        "llmgw_node/src/llmgw_node/procs.py",
        '"shards": [converter.unstructure(r) for r in records]',
        '"shards": [_unstructure_record(r) for r in records]',
    ),
    # Tests that send a frame's keys as keyword arguments: the key is the wire's, not a Python name.
    ("tests/shared/test_wire.py", "(_start_frame(replica_id=3),", '(_start_frame(**{"shard_id": 3}),'),
    (
        "tests/shared/test_wire.py",
        '_start_frame(port="x", replica_id=1, bogus=True)',
        '_start_frame(port="x", bogus=True, **{"shard_id": 1})',
    ),
    # Prose where the replica and its record (or its shard) were two words.
    (
        "docs/architecture.md",
        "a replica is published to the router when its replica reports `ready`",
        "a replica is published to the router when it reports `ready`",
    ),
    (
        "docs/failover.md",
        "cancelled; its replicas forgotten, its replicas withdrawn",
        "cancelled; its replica records forgotten, its replicas withdrawn",
    ),
    ("docs/node.md", "*replica*. Control drives it", "*replica* (the v1 wire spells it `shard`). Control drives it"),
    (
        "docs/wire-protocol.md",
        "the code wins and this page has a bug.\n",
        "the code wins and this page has a bug. The v1 wire spells replica `shard`: the message tags\n"
        "(`start_shard`, `shard_state`, ...) and the keys `shard_id`, `shard` and `shards` keep that\n"
        "spelling, which deployed nodes and controls read; the Python classes say replica, and\n"
        "`wire.v1_key` maps each renamed field to its key.\n",
    ),
    ("docs/admin-api.md", '"drained": [shard ids]}', '"drained": [replica ids]}'),
    ("docs/failover.md", "(so the shard-key secret is", "(so the replica-key secret is"),
    ("docs/node.md", "svc.supervisor.output(shard_id, n=300) ", "svc.supervisor.output(replica_id, n=300)"),
    (
        "examples/node.toml",
        "engine logs and the shard state file live here",
        "engine logs and the replica state file live here",
    ),
    ("examples/systemd/llmgw-node.service", "# Shard keys (shards.json)", "# Replica keys (shards.json)"),
    (
        "llmgw_control/src/llmgw_control/units/llmgw-node.service",
        "# Shard keys (shards.json)",
        "# Replica keys (shards.json)",
    ),
    # Human text whose string has no space (so the token pass keeps it).
    (
        "llmgw_node/src/llmgw_node/supervisor.py",
        'name=f"shard:{replica.spec.replica_id}"',
        'name=f"replica:{replica.spec.replica_id}"',
    ),
    # Lines the longer names took past 120 columns.
    (
        "llmgw_control/src/llmgw_control/fleet/reconciler.py",
        "    def replica_spec(self, resolved: Resolved, replica_id: str, port: int, devices: tuple[int, ...] = ()) -> ReplicaSpec:\n",
        "    def replica_spec(self, resolved: Resolved, replica_id: str, port: int,\n"
        "                     devices: tuple[int, ...] = ()) -> ReplicaSpec:\n",
    ),
    (
        "tests/control/test_reconciler.py",
        '    rehello(inventory, dispatcher, clock, "n1", [ReplicaState(start.replica.replica_id, "ready", port=start.replica.port)],\n'
        '            address="203.0.113.7")',
        '    rehello(inventory, dispatcher, clock, "n1",\n'
        '            [ReplicaState(start.replica.replica_id, "ready", port=start.replica.port)], address="203.0.113.7")',
    ),
    (
        "tests/node/test_served_engines.py",
        "def spec(engine: str, model_dir: str, *, env: dict[str, str] | None = None, args: list[str] | None = None) -> ReplicaSpec:\n",
        "def spec(engine: str, model_dir: str, *, env: dict[str, str] | None = None,\n"
        "         args: list[str] | None = None) -> ReplicaSpec:\n",
    ),
    (
        "tests/shared/test_wire.py",
        '    Heartbeat(seq=8, facts=FACTS, replicas=[ReplicaState(replica_id="s", status="failed", detail="x", last_lines=["a"])]),\n',
        "    Heartbeat(seq=8, facts=FACTS,\n"
        '              replicas=[ReplicaState(replica_id="s", status="failed", detail="x", last_lines=["a"])]),\n',
    ),
    (
        "tests/shared/test_wire.py",
        '    ReplicaStateReport(replica=ReplicaState(replica_id="s", status="ready", port=20000, pid=7, rss_mib=812, vram_mib=4096)),\n',
        '    ReplicaStateReport(replica=ReplicaState(replica_id="s", status="ready", port=20000, pid=7, rss_mib=812,\n'
        "                                            vram_mib=4096)),\n",
    ),
    (
        "tests/shared/test_wire_golden.py",
        "    st.builds(ReplicaLogsReply, in_reply_to=_TEXT, replica_id=_ID, found=st.booleans(), lines=st.lists(_TEXT, max_size=3),\n"
        "              cursor=_CURSOR),\n",
        "    st.builds(ReplicaLogsReply, in_reply_to=_TEXT, replica_id=_ID, found=st.booleans(),\n"
        "              lines=st.lists(_TEXT, max_size=3), cursor=_CURSOR),\n",
    ),
    ("llmgw_control/src/llmgw_control/ctl/main.py", '"GPUS", "SHARDS", "ENGINES"', '"GPUS", "REPLICAS", "ENGINES"'),
    (
        "llmgw_control/src/llmgw_control/admin/dashboard/static/dashboard.js",
        'h("dt", {}, "Shards")',
        'h("dt", {}, "Replicas")',
    ),
    (
        "tests/test_lifecycles.py",
        """        "replica shard.state.status: stopped -> ready is not in the table",
""",
        """        "replica replica.state.status: stopped -> ready is not in the table",
""",
    ),
    (
        "llmgw_node/src/llmgw_node/supervisor.py",
        """            replica_id=replica.spec.replica_id, status=on_wire(status), detail=detail, port=replica.spec.port, pid=replica.pid,
            restarts=replica.restarts,
""",
        """            replica_id=replica.spec.replica_id, status=on_wire(status), detail=detail, port=replica.spec.port,
            pid=replica.pid, restarts=replica.restarts,
""",
    ),
    (
        WIRE,
        """    | SetEngines | StartReplica | StopReplica | DrainReplica | SetAdapters | RemoveWeights | GetReplicaLogs | ReplicaLogsReply
""",
        """    | SetEngines | StartReplica | StopReplica | DrainReplica | SetAdapters | RemoveWeights | GetReplicaLogs
    | ReplicaLogsReply
""",
    ),
]

# ----------------------------------------------------------------------------------------- rules

_WORD = re.compile(
    r"[A-Za-z0-9_]*(?:shard|Shard|SHARD)[A-Za-z0-9_]*|"
    + "|".join(rf"(?<!\w){re.escape(n)}(?!\w)" for n in NAMES if "shard" not in n.lower())
)
_PLAIN = {
    "shard": "replica",
    "shards": "replicas",
    "Shard": "Replica",
    "Shards": "Replicas",
    "SHARD": "REPLICA",
    "SHARDS": "REPLICAS",
}
_QUOTES = "\"'`"


def ident(name: str) -> str:
    """The new name of a Python identifier."""
    if name in KEEP_NAMES:
        return name
    if name in NAMES:
        return NAMES[name]
    return name.replace("SHARD", "REPLICA").replace("Shard", "Replica").replace("shard", "replica")


def _rename_words(text: str, keep: Callable[[re.Match[str]], bool]) -> str:
    def one(m: re.Match[str]) -> str:
        word = m.group(0)
        if keep(m):
            return word
        return _PLAIN.get(word) or ident(word)

    return _WORD.sub(one, text)


def _beside_code(m: re.Match[str]) -> bool:
    """In quotes or backticks, or part of a path or a dotted JSON path: a spelling, not a word.

    A class name (``ShardSpec.devices``) is renamed anywhere but in quotes.
    """
    s, a, b = m.string, m.start(), m.end()
    before = s[a - 1] if a else " "
    after = s[b] if b < len(s) else " "
    after2 = s[b + 1] if b + 1 < len(s) else " "
    if before in _QUOTES and after in _QUOTES:
        return True
    if m.group(0)[0].isupper() and m.group(0) not in _PLAIN:
        return False
    if before in "/-" or after in "/-":
        return True
    if before == "." and a >= 2 and (s[a - 2].isalnum() or s[a - 2] in "_)"):
        return True
    return after == "." and (after2.isalnum() or after2 == "_")


def prose(text: str) -> str:
    """Comments, docstrings, messages: the words change, the wire's tags and code spellings stay."""
    return _rename_words(text, lambda m: m.group(0) in WIRE_TAGS or m.group(0) in KEEP_NAMES or _beside_code(m))


def _fstring_code(body: str) -> str:
    """The identifiers inside an f-string's braces (not the quoted keys in them)."""

    def braces(m: re.Match[str]) -> str:
        return _rename_words(m.group(0), lambda w: w.string[w.start() - 1 : w.start()] in _QUOTES)

    return re.sub(r"(?<!\{)\{[^{}]*\}", braces, body)


def token_string(body: str) -> str:
    """A string with no whitespace: a key, tag, file name; only class and constant names change."""
    return _rename_words(body, lambda m: not m.group(0)[0].isupper() or m.group(0) in V1_SPELLINGS)


_PY = re.compile(
    r"""(?P<str>(?<!\w)[rRbBuUfF]{0,2}(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))"""
    r"""|(?P<com>\#[^\n]*)|(?P<name>[A-Za-z_]\w*)"""
)
_STR = re.compile(r"""(?P<prefix>[rRbBuUfF]{0,2})(?P<q>'''|\"\"\"|'|")(?P<body>[\s\S]*)(?P=q)$""")


def python(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        tok = m.group(0)
        if m.group("name"):
            return ident(tok) if _WORD.fullmatch(tok) else tok
        if m.group("com"):
            return prose(tok)
        parts = _STR.match(tok)
        if parts is None or not _WORD.search(tok):
            return tok
        prefix, q, body = parts.group("prefix"), parts.group("q"), parts.group("body")
        if "b" in prefix.lower():
            return tok
        is_f = "f" in prefix.lower()
        if re.search(r"\s", re.sub(r"\{[^{}]*\}", "", body) if is_f else body):
            new = prose(body)
            # prose() renamed code in braces as words; redo them as code (keys in quotes stay).
            if is_f:
                new = _fstring_code(new)
        else:
            new = _fstring_code(token_string(body)) if is_f else token_string(body)
        return prefix + q + new + q

    return _PY.sub(one, text)


_BLOCK = re.compile(r"(```[\s\S]*?```)")
_SPAN = re.compile(r"(`[^`\n]+`)")
# A link to a heading whose words were renamed: ``(#shard-ids)`` is ``(#replica-ids)`` now.
_ANCHOR = re.compile(r"(?<=[#-])(shards?)(?=[-)])")


def markdown(text: str, path: str) -> str:
    wire_doc = path in WIRE_DOCS

    def code(span: str) -> str:
        return _rename_words(span, lambda m: m.group(0) in V1_SPELLINGS or (_beside_code(m) and m.group(0) in _PLAIN))

    def wire_prose(line: str) -> str:
        # The wire's pages list a frame's fields by their v1 keys: ``shard_id``, ``shard: `Spec```.
        def keep(m: re.Match[str]) -> bool:
            word, rest = m.group(0), m.string[m.end() :]
            if word in V1_SPELLINGS and ("_" in word or re.match(r": \[?(`|$)", rest)):
                return True
            return word in WIRE_TAGS or word in KEEP_NAMES or _beside_code(m)

        return _rename_words(line, keep)

    def line(text: str) -> str:
        pieces = _SPAN.split(text)
        words = wire_prose if wire_doc else prose
        out = "".join(code(p) if i % 2 else words(p) for i, p in enumerate(pieces))
        return re.sub(r"\]\([\w./-]*#[\w-]+\)", lambda m: _ANCHOR.sub(lambda w: _PLAIN[w.group(1)], m.group(0)), out)

    blocks = _BLOCK.split(text)
    return "".join((python(b) if not wire_doc else code(b)) if i % 2 else line(b) for i, b in enumerate(blocks))


# ----------------------------------------------------------------------------------------- driver


def _files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    fixed = {path for path, _, _ in FIXES}
    return sorted(
        p for p in out if p not in LEAVE and (ROOT / p).is_file() and (p.endswith((".py", ".md")) or p in fixed)
    )


def _context(path: str, text: str, kept: list[str]) -> str:
    for pattern, new in PATHS:
        text = re.sub(pattern, new, text)
    for glob, pattern, repl in CONTEXT:
        if not fnmatch.fnmatch(path, glob):
            continue
        if repl is None:

            def hold(m: re.Match[str]) -> str:
                kept.append(m.group(0))
                return f"\0{len(kept) - 1}\0"

            text = re.sub(pattern, hold, text, flags=re.M)
        else:
            text = re.sub(pattern, repl, text, flags=re.M)
    return text


def rewrite(path: str, text: str) -> str:
    kept: list[str] = []
    text = _context(path, text, kept)
    if path.endswith(".py"):
        text = python(text)
    elif path.endswith(".md"):
        text = markdown(text, path)
    return _restore(text, kept)


def _restore(text: str, kept: list[str]) -> str:
    return re.sub("\0(\\d+)\0", lambda m: kept[int(m.group(1))], text)


def fix(path: str, text: str, problems: list[str]) -> str:
    for where, old, new in FIXES:
        if where != path or (new in text and old not in new) or (old in new and new in text):
            continue
        if old not in text:
            problems.append(f"{path}: anchor not found, do by hand: {old.splitlines()[0][:90]!r}")
            continue
        text = text.replace(old, new, 1)
    return text


def clashes(path: str, before: str) -> list[str]:
    """Scopes where a renamed name meets the name it becomes (two things would get one name)."""
    try:
        tree = ast.parse(before)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
            continue
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        names |= {
            a.arg
            for n in ast.walk(node)
            if isinstance(n, ast.arguments)
            for a in (*n.args, *n.kwonlyargs, *n.posonlyargs)
        }
        if isinstance(node, ast.ClassDef):
            names |= {t.target.id for t in node.body if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
        for name in sorted(names):
            new = ident(name)
            if new != name and new in names and not isinstance(node, ast.Module):
                found.append(f"{path}:{node.lineno}: {getattr(node, 'name', '')}: {name} and {new}")
    return found


def _sort_imports(paths: list[str]) -> None:
    """Renamed imports sort differently: let ruff put them (and ``__all__``) back in order."""
    ruff = ROOT / ".venv" / "bin" / "ruff"
    if paths and ruff.exists():
        subprocess.run(
            [str(ruff), "check", "--quiet", "--fix-only", "--select", "I001,RUF022", *paths], cwd=ROOT, check=False
        )
    elif paths:
        print("HAND STEP: no .venv/bin/ruff: run `ruff check --fix --select I001,RUF022` on the changed files")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a run would")
    args = parser.parse_args()
    changed: list[str] = []
    problems: list[str] = []
    for old, new in MOVES:
        if (ROOT / old).exists() and (ROOT / new).exists():
            problems.append(f"both {old} and {new} exist: merge them by hand")
        elif (ROOT / old).exists():
            changed.append(f"move {old} -> {new}")
            if not args.check:
                subprocess.run(["git", "mv", old, new], check=True, cwd=ROOT)
    warnings: list[str] = []
    for path in _files():
        text = (ROOT / path).read_text()
        if path.endswith(".py"):
            held: list[str] = []
            warnings += clashes(path, _restore(_context(path, text, held), held))
        new = fix(path, rewrite(path, text), problems)
        if rewrite(path, new) != new:  # a rerun would change it again: a rule or a fix to mend
            problems.append(f"{path}: the rules rewrite their own output (not idempotent)")
        if new != text:
            changed.append(path)
            if not args.check:
                (ROOT / path).write_text(new)
    _sort_imports([p for p in changed if p.endswith(".py")] if not args.check else [])
    for line in changed:
        print("changed:", line)
    for line in warnings:
        print("look (both names in one scope):", line)
    for line in problems:
        print("HAND STEP:", line)
    return 1 if args.check and changed else (2 if problems else 0)


if __name__ == "__main__":
    sys.exit(main())
