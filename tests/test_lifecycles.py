"""Every lifecycle is one StrEnum and one table (``llmgw_shared.transitions.Lifecycle``), and the
code keeps to it.

* The tables: every state is reachable from a start, every state that is not an end can reach one,
  and ``move`` accepts exactly what the table lists (hypothesis walks).
* The code, read (an AST scan of both daemons): every change of a lifecycle's state goes through
  its table's ``move`` (or the node's ``Supervisor._set``, or control's ``ReplicaRecord.move``, which
  check it); none assigns a bare state; none compares a state with a string literal; and every
  transition whose "from" is visible in the source -- a guard ``if x.state != A: return`` or an
  earlier move in the same straight-line code -- is in the table.
* The code, run: node liveness (derived, never stored) through random events, and the node's
  supervisor and engine manager offered random statuses: nothing they record or report leaves
  the table.
  (Control's absorption of random node reports is tests/control/test_lifecycle.py.)
* docs/architecture.md carries each table as ``Lifecycle.table()`` writes it.
"""

from __future__ import annotations

import ast
import itertools
import logging
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_control.fleet.capacity_runs import RUN_LIFECYCLE, RunState
from llmgw_control.fleet.inventory import NODE_LIVENESS, Liveness, NodeRecord
from llmgw_control.gateway.exchange import EXCHANGE_LIFECYCLE
from llmgw_control.mirror.pulls import PULL_LIFECYCLE
from llmgw_control.store.ops_capacity import RUN_STATES
from llmgw_node.engines.manager import EngineManager
from llmgw_node.supervisor import Supervisor, _Replica
from llmgw_shared.engine_lifecycle import ENGINE_LIFECYCLE, EngineInstall
from llmgw_shared.facts import unprobed
from llmgw_shared.replica_lifecycle import REPLICA_LIFECYCLE, ReplicaStatus
from llmgw_shared.transitions import ImpossibleTransition, Lifecycle
from llmgw_shared.wire import ReplicaSpec, WireReplicaStatus

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "llmgw_control" / "src", ROOT / "llmgw_node" / "src", ROOT / "shared" / "src"]

# The name each table is known by in the code, and its enum.
LIFECYCLES: dict[str, Lifecycle[Any]] = {
    "REPLICA_LIFECYCLE": REPLICA_LIFECYCLE,
    "NODE_LIVENESS": NODE_LIVENESS,
    "PULL_LIFECYCLE": PULL_LIFECYCLE,
    "RUN_LIFECYCLE": RUN_LIFECYCLE,
    "ENGINE_LIFECYCLE": ENGINE_LIFECYCLE,
    "EXCHANGE_LIFECYCLE": EXCHANGE_LIFECYCLE,
}
# Lifecycles with an end that not every state can reach, and why that is right.
ENDLESS = {
    # An installed engine is re-checked and a failed one retried for as long as the node runs;
    # only ``unconfigured`` is final (until a restart with a new config).
    "engine install": "cycles for the daemon's life",
}
ENUMS: dict[str, Lifecycle[Any]] = {lc.enum.__name__: lc for lc in LIFECYCLES.values()}
# Modules whose ``.state``/``.status`` comparisons are of these lifecycles (elsewhere a "failed"
# may be an engine's install status, which is not one of them).
OWNERS = {
    "llmgw_control/fleet/reconciler.py",
    "llmgw_control/fleet/replica_records.py",
    "llmgw_control/fleet/plan.py",
    "llmgw_control/fleet/inventory.py",
    "llmgw_control/fleet/eviction.py",
    "llmgw_control/fleet/metrics.py",
    "llmgw_control/fleet/capacity_runs.py",
    "llmgw_control/mirror/pulls.py",
    "llmgw_node/supervisor.py",
    "llmgw_node/engines/manager.py",
    "llmgw_node/cli.py",
    "llmgw_control/admin/fleet_views.py",
    "llmgw_control/gateway/exchange.py",
}


# --------------------------------------------------------------------------- the tables


@pytest.mark.parametrize("lifecycle", LIFECYCLES.values(), ids=LIFECYCLES.keys())
def test_every_state_is_reachable_and_every_other_can_end(lifecycle: Lifecycle[Any]) -> None:
    assert lifecycle.reachable() == lifecycle.states, "unreachable: " + ", ".join(
        sorted(lifecycle.states - lifecycle.reachable())
    )
    if lifecycle.terminal and lifecycle.name not in ENDLESS:  # node liveness has no end: a lost node may come back
        stuck = [s for s in lifecycle.states if not lifecycle.can_end(s)]
        assert not stuck, f"{lifecycle.name}: cannot end from {stuck}"


def test_the_wire_and_the_store_spell_the_states_as_the_enums_do() -> None:
    from typing import get_args

    assert set(get_args(WireReplicaStatus)) == {str(s) for s in ReplicaStatus} - {ReplicaStatus.ASSIGNED}
    assert set(RUN_STATES) == {str(s) for s in RunState}


def test_the_admin_cli_reads_the_api_states_as_the_tables_say() -> None:
    """``llmgw-control ctl`` is a client of the admin API: it spells states as the API does, without
    importing the daemon's modules, so its sets are checked here."""
    from llmgw_control.ctl.bench_cmds import FINISHED as RUN_FINISHED
    from llmgw_control.ctl.mirror_cmds import RUNNING as PULL_RUNNING
    from llmgw_control.mirror.pulls import IN_PROGRESS

    assert set(RUN_FINISHED) == RUN_LIFECYCLE.terminal
    assert set(PULL_RUNNING) == IN_PROGRESS


def test_a_table_must_cover_its_enum() -> None:
    class Two(StrEnum):
        A = "a"
        B = "b"

    with pytest.raises(ValueError, match="every state"):
        Lifecycle("two", Two, start={Two.A}, transitions={Two.A: {Two.B}})


@pytest.mark.parametrize("lifecycle", LIFECYCLES.values(), ids=LIFECYCLES.keys())
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_move_walks_only_the_table(lifecycle: Lifecycle[Any], data: st.DataObject) -> None:
    """Random proposals from a start: ``move`` takes exactly the table's, and refuses the rest."""
    states = sorted(lifecycle.states)
    current = data.draw(st.sampled_from(sorted(lifecycle.start)))
    for new in data.draw(st.lists(st.sampled_from(states), max_size=30)):
        in_table = new in lifecycle.transitions[current] or (new == current and current not in lifecycle.terminal)
        if in_table:
            current = lifecycle.move("x", current, new)
        else:
            with pytest.raises(ImpossibleTransition):
                lifecycle.move("x", current, new)


# --------------------------------------------------------------------------- the code, read


@attrs.frozen
class Finding:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def _member(node: ast.AST | None) -> tuple[Lifecycle[Any], StrEnum] | None:
    """``PullState.READY`` -> (its lifecycle, the member); None for anything else."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ENUMS:
        lifecycle = ENUMS[node.value.id]
        return lifecycle, lifecycle.enum[node.attr]
    return None


def _moves(call: ast.Call) -> tuple[Lifecycle[Any], str, ast.AST] | None:
    """A call that changes a lifecycle's state: (lifecycle, what it moves, the new state's node)."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    # TABLE.move(what, current, new), and control's lifecycle.check(replica_id, current, new)
    if func.attr == "move" and isinstance(func.value, ast.Name) and func.value.id in LIFECYCLES and len(call.args) == 3:
        return LIFECYCLES[func.value.id], ast.unparse(call.args[1]), call.args[2]
    if func.attr == "check" and isinstance(func.value, ast.Name) and func.value.id == "lifecycle":
        return REPLICA_LIFECYCLE, ast.unparse(call.args[1]), call.args[2]
    # The node's Supervisor._set(replica, status, ...) and EngineManager._set(key, status, ...), and
    # control's ReplicaRecord.move(status, ...) and the gateway's Exchange.move(state)
    if func.attr == "_set" and len(call.args) >= 2 and (member := _member(call.args[1])) is not None:
        return member[0], f"{ast.unparse(call.args[0])}.state.status", call.args[1]
    if func.attr == "move" and call.args and (member := _member(call.args[0])) is not None:
        attribute = "status" if member[0] is REPLICA_LIFECYCLE else "state"
        return member[0], f"{ast.unparse(func.value)}.{attribute}", call.args[0]
    return None


class _Flow:
    """What each state is known to be, statement by statement through one function body.

    Knowledge comes from a guard that leaves (``if x.state != A: return``), a test (``if
    x.state == A:``, inside it) and a move (after it); it is dropped wherever control flow joins
    paths it cannot follow (after a branch, a loop, a try). A move whose "from" is known is checked.
    """

    def __init__(self, where: str, findings: list[Finding]) -> None:
        self.where = where
        self.findings = findings

    def block(self, body: list[ast.stmt], known: dict[str, StrEnum]) -> dict[str, StrEnum]:
        for stmt in body:
            known = self.stmt(stmt, known)
        return known

    def stmt(self, stmt: ast.stmt, known: dict[str, StrEnum]) -> dict[str, StrEnum]:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return known  # scanned on its own
        if isinstance(stmt, ast.If):
            test = self.exprs(stmt.test, known)
            inside = dict(test)
            if (fact := _fact(stmt.test, "==")) is not None:
                inside[fact[0]] = fact[1]
            after_body = self.block(stmt.body, inside)
            after_else = self.block(stmt.orelse, dict(test))
            if (fact := _fact(stmt.test, "!=")) is not None and _leaves(stmt.body) and not stmt.orelse:
                return {**test, fact[0]: fact[1]}
            if _leaves(stmt.body):
                return after_else
            return {k: v for k, v in after_body.items() if after_else.get(k) == v}
        if isinstance(stmt, ast.With | ast.AsyncWith):
            return self.block(stmt.body, known)
        if isinstance(stmt, ast.Try):
            self.block(stmt.body, dict(known))
            for handler in stmt.handlers:
                self.block(handler.body, {})
            self.block(stmt.orelse, {})
            self.block(stmt.finalbody, {})
            return {}
        if isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
            self.block(stmt.body, {})
            self.block(stmt.orelse, {})
            return {}
        if isinstance(stmt, ast.Match):
            for case in stmt.cases:
                self.block(case.body, {})
            return {}
        return self.exprs(stmt, known)

    def exprs(self, node: ast.AST, known: dict[str, StrEnum]) -> dict[str, StrEnum]:
        """Moves in the order Python evaluates them (near enough: calls inside out, left to right)."""
        known = dict(known)
        for call in _calls(node):
            found = _moves(call)
            if found is None:
                continue
            lifecycle, target, new_node = found
            member = _member(new_node)
            if member is None:
                continue  # a state only known when it runs: the table checks it then
            if member[0] is not lifecycle:
                self.findings.append(
                    Finding(
                        f"{self.where}:{call.lineno}", f"moves {target} ({lifecycle.name}) to a {member[0].name} state"
                    )
                )
                continue
            before = known.get(target)
            if before is not None and not lifecycle.allowed(before, member[1]):
                self.findings.append(
                    Finding(
                        f"{self.where}:{call.lineno}",
                        f"{lifecycle.name} {target}: {before} -> {member[1]} is not in the table",
                    )
                )
            known[target] = member[1]
        return known


def _calls(node: ast.AST) -> Iterator[ast.Call]:
    children = [node] if isinstance(node, ast.Call) else []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Lambda):
            continue  # runs later, if at all
        yield from _calls(child)
    yield from children


def _fact(test: ast.expr, op: str) -> tuple[str, StrEnum] | None:
    """``x.state != PullState.READY`` (one comparison) -> ("x.state", READY)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or if op == "!=" else ast.And):
        for value in test.values:
            if (fact := _fact(value, op)) is not None:
                return fact
        return None
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    if not isinstance(test.ops[0], ast.NotEq if op == "!=" else ast.Eq):
        return None
    member = _member(test.comparators[0])
    return (ast.unparse(test.left), member[1]) if member is not None else None


def _leaves(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Return | ast.Raise | ast.Continue | ast.Break)


def _is_state(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in ("state", "status")) or (
        isinstance(node, ast.Name) and node.id in ("state", "status")
    )


def _births(tree: ast.AST) -> set[int]:
    """Assignments in a constructor of a start state (``self.state = ExchangeState.IDLE``): where a
    thing begins, not a change of state."""
    found = set()
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef) and function.name == "__init__":
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Assign)
                    and (member := _member(node.value)) is not None
                    and member[1] in member[0].start
                ):
                    found.add(id(node))
    return found


def scan(path: Path, relative: str) -> list[Finding]:
    tree = ast.parse(path.read_text(), str(path))
    findings: list[Finding] = []
    values = {str(s) for lc in LIFECYCLES.values() for s in lc.states}
    births = _births(tree)
    for node in ast.walk(tree):
        where = f"{relative}:{getattr(node, 'lineno', 0)}"
        # A bare state assigned: the change bypasses the table.
        if isinstance(node, ast.Assign) and id(node) not in births:
            for target in node.targets:
                pairs = (
                    zip(target.elts, node.value.elts, strict=False)
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    else [(target, node.value)]
                )
                for left, right in pairs:
                    if _is_state(left) and _member(right) is not None:
                        findings.append(
                            Finding(
                                where, f"{ast.unparse(left)} = {ast.unparse(right)} bypasses the table: use its move"
                            )
                        )
        # A state compared with a string: the enum's member is the one spelling.
        if isinstance(node, ast.Compare) and relative in OWNERS:
            sides = [node.left, *node.comparators]
            if any(_is_state(s) for s in sides):
                for side in sides:
                    texts = side.elts if isinstance(side, ast.Tuple | ast.Set | ast.List) else [side]
                    for text in texts:
                        if isinstance(text, ast.Constant) and text.value in values:
                            findings.append(Finding(where, f"compares a state with the string {text.value!r}"))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            _Flow(f"{relative}:{node.name}", findings).block(node.body, {})
    return findings


def scan_tree() -> list[Finding]:
    findings: list[Finding] = []
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            relative = str(path.relative_to(source))
            findings += scan(path, relative)
    return findings


def test_every_transition_the_code_takes_is_in_its_table() -> None:
    findings = scan_tree()
    assert not findings, "\n".join(map(str, findings))


def test_the_scan_sees_the_moves() -> None:
    """A scan that found nothing to check would pass anything: it must see the code's moves."""
    seen: dict[str, int] = {}
    for source in SOURCES:
        for path in source.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and (found := _moves(node)) is not None:
                    seen[found[0].name] = seen.get(found[0].name, 0) + 1
    assert seen.get("replica", 0) >= 20 and seen.get("pull", 0) >= 6 and seen.get("capacity run", 0) >= 4, seen
    assert seen.get("engine install", 0) >= 7 and seen.get("exchange", 0) >= 10, seen


BAD = """
async def _download(self, pull):
    pull.state = PULL_LIFECYCLE.move(pull.id, pull.state, PullState.DOWNLOADING)
    pull.state = PULL_LIFECYCLE.move(pull.id, pull.state, PullState.PUBLISHED)

async def publish(self, run):
    if run.state != RunState.QUEUED:
        return
    run.state = RUN_LIFECYCLE.move(run.id, run.state, RunState.DONE)
    run.state, run.error = RunState.FAILED, "bypassed"

def _prepare(self, replica):
    self._set(replica, ReplicaStatus.STOPPED, "stopped before it started")
    self._set(replica, ReplicaStatus.READY, "")

def liveness(node):
    return node.state == "lost"

def want(self, key):
    self._set(key, EngineInstall.UNCONFIGURED, "not here")
    self._set(key, EngineInstall.INSTALLING, "queued")

class Exchange:
    def __init__(self):
        self.state = ExchangeState.IDLE

    def respond(self):
        self.move(ExchangeState.COMPLETE)
        self.state = ExchangeState.STREAMING
"""


def test_the_scan_catches_what_breaks_a_table(tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text(BAD)
    found = sorted(f.what for f in scan(path, "llmgw_control/fleet/plan.py"))
    assert found == sorted(
        [
            "run.state = RunState.FAILED bypasses the table: use its move",
            "compares a state with the string 'lost'",
            "pull pull.state: downloading -> published is not in the table",
            "capacity run run.state: queued -> done is not in the table",
            "replica replica.state.status: stopped -> ready is not in the table",
            "engine install key.state.status: unconfigured -> installing is not in the table",
            "self.state = ExchangeState.STREAMING bypasses the table: use its move",
        ]
    ), found


# --------------------------------------------------------------------------- the code, run


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.just(("hello", 0.0)), st.just(("closed", 0.0)), st.tuples(st.just("wait"), st.floats(0, 200))),
        max_size=40,
    )
)
def test_node_liveness_changes_only_along_its_table(events: list[tuple[str, float]]) -> None:
    liveness = Liveness(unreachable_after=15, lost_after=60)
    now = 0.0
    node = NodeRecord("n1", "127.0.0.1", unprobed(), last_seen=now)
    before = liveness.state(node, now)
    assert before in NODE_LIVENESS.start
    for kind, seconds in events:
        if kind == "hello":  # a hello makes a new record (fleet/agents.py); any later message is heard
            node = NodeRecord("n1", "127.0.0.1", unprobed(), last_seen=now)
        elif kind == "closed":
            node.connected = False
        else:
            now += seconds
        after = liveness.state(node, now)
        assert NODE_LIVENESS.allowed(before, after), (before, after, kind)
        before = after


class _Offered:
    """The node's supervisor with nothing running: only its bookkeeping of a replica's status."""

    def __init__(self, tmp_path: Path) -> None:
        self.sent: list[str] = []
        self.supervisor = Supervisor(
            tmp_path,
            None,
            None,
            None,  # type: ignore[arg-type]
            on_change=lambda state: self.sent.append(state.status),
        )
        spec = ReplicaSpec("m-cpu-1", "llama.cpp", "b1", None, 20000, "k", model_dir="/m")
        self.replica = _Replica(spec)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(sorted(set(ReplicaStatus) - {ReplicaStatus.ASSIGNED})), max_size=25))
def test_the_node_records_and_reports_only_the_tables_transitions(
    tmp_path_factory: pytest.TempPathFactory, offers: list[ReplicaStatus]
) -> None:
    offered = _Offered(tmp_path_factory.mktemp("node"))
    status = ReplicaStatus(offered.replica.state.status)
    reported = [status]
    for new in offers:
        offered.supervisor._set(offered.replica, new, f"to {new}")
        if REPLICA_LIFECYCLE.allowed(status, new):
            status = new
        assert offered.replica.state.status == status  # refused: it keeps its status
    reported += [ReplicaStatus(s) for s in offered.sent]
    for before, after in itertools.pairwise(reported):
        assert REPLICA_LIFECYCLE.allowed(before, after), reported


def test_a_forbidden_transition_on_the_node_is_logged_and_not_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    offered = _Offered(tmp_path)
    offered.supervisor._set(offered.replica, ReplicaStatus.FAILED, "engine missing")
    with caplog.at_level(logging.ERROR):
        offered.supervisor._set(offered.replica, ReplicaStatus.READY, "")
    assert offered.sent == ["failed"]
    assert offered.replica.state.status == "failed"
    assert "failed -> ready is not in the replica lifecycle's table" in caplog.text


def _engines(tmp_path: Path, sent: list[str]) -> EngineManager:
    """The node's engine manager with nothing to install: only its bookkeeping of engine statuses."""
    return EngineManager(tmp_path, None, None, on_change=lambda state: sent.append(state.status))  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(sorted(EngineInstall)), max_size=25))
def test_the_node_records_and_reports_only_the_engine_tables_transitions(
    tmp_path_factory: pytest.TempPathFactory, offers: list[EngineInstall]
) -> None:
    sent: list[str] = []
    engines = _engines(tmp_path_factory.mktemp("node"), sent)
    key = ("llama.cpp", "b1")
    status = engines.status(*key)
    reported = [status]
    for i, new in enumerate(offers):
        engines._set(key, new, f"offer {i}")
        if ENGINE_LIFECYCLE.allowed(status, new):
            status = new
        assert engines.status(*key) is status  # refused: it keeps its status
    reported += [EngineInstall(s) for s in sent]
    for before, after in itertools.pairwise(reported):
        assert ENGINE_LIFECYCLE.allowed(before, after), reported


def test_a_forbidden_engine_transition_is_logged_and_not_sent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sent: list[str] = []
    engines = _engines(tmp_path, sent)
    engines._set(("vllm", "1"), EngineInstall.UNCONFIGURED, "not configured here")
    with caplog.at_level(logging.ERROR):
        state = engines._set(("vllm", "1"), EngineInstall.INSTALLED, "")
    assert sent == ["unconfigured"] and state.status == "unconfigured"
    assert engines.status("vllm", "1") is EngineInstall.UNCONFIGURED
    assert "unconfigured -> installed is not in the engine install lifecycle's table" in caplog.text


# --------------------------------------------------------------------------- the docs


def test_the_architecture_doc_carries_every_table() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    for name, lifecycle in LIFECYCLES.items():
        assert lifecycle.table() in text, f"docs/architecture.md: the {name} table differs from the code:\n" + (
            lifecycle.table()
        )
