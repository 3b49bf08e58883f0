"""No hand-written polling loop in the tests (issue 33): a loop whose body sleeps and checks again
is ``wait_until`` / ``wait_until_sync`` (tests/support/waiting.py), which has a deadline, one
interval, and returns what it waited for.

A polling loop, as this scan sees it: a ``while`` or ``for`` loop (async or not) whose own body
(not a function defined in it) calls ``trio.sleep``, ``time.sleep`` or ``asyncio.sleep``, and
that checks again: a ``while`` with a condition, or a loop that leaves by ``break`` or ``return``.
A ``while True`` or ``for`` loop that only paces work (sends a request every so often until it is
cancelled) is not one.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent

# (file, the loop's first line as written) → why it stays a loop. Keep this short.
ALLOWED: dict[tuple[str, str], str] = {
    ("support/waiting.py", "while True:"): "wait_until and wait_until_sync themselves",
    (
        "control/test_agent_commands.py",
        "while ack:",
    ): "a fake node's own loop: acks what control sent and beats every half heartbeat until told to stop",
    (
        "control/test_demand.py",
        "for _ in range(40):",
    ): "the scenario itself on the fake clock: each step serves one request and advances time; it ends at the drain",
    (
        "control/test_upstream.py",
        "while True:",
    ): "a fake engine's HTTP loop: its sleep is the slow answer under test, its return a connection it closes",
}

SLEEPS = {("trio", "sleep"), ("time", "sleep"), ("asyncio", "sleep")}


def _own_nodes(body: list[ast.stmt]) -> list[ast.AST]:
    """Every node of ``body``, not descending into functions, classes or lambdas defined there."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _sleeps(nodes: list[ast.AST]) -> bool:
    for node in nodes:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and (node.func.value.id, node.func.attr) in SLEEPS
        ):
            return True
    return False


def _leaves(loop: ast.While | ast.For | ast.AsyncFor) -> bool:
    """A ``break`` of this loop (not of a loop inside it), or a ``return``."""
    stack: list[ast.AST] = list(loop.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return | ast.Break):
            return True
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.While | ast.For | ast.AsyncFor):
            # A break inside belongs to that loop; a return still leaves this one.
            if any(isinstance(n, ast.Return) for n in _own_nodes(node.body)):
                return True
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def polling_loops(source: str) -> list[tuple[int, str]]:
    """The polling loops in ``source``: (line, the loop's first line)."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.While | ast.For | ast.AsyncFor):
            continue
        if not _sleeps(_own_nodes(node.body)):
            continue
        checks = isinstance(node, ast.While) and not (isinstance(node.test, ast.Constant) and node.test.value)
        if checks or _leaves(node):
            found.append((node.lineno, lines[node.lineno - 1].strip()))
    return found


def test_the_scan_tells_polls_from_pacing() -> None:
    poll = "async def f():\n    while not ready():\n        await trio.sleep(0.1)\n"
    poll_break = "def f():\n    for _ in range(50):\n        if ready():\n            break\n        time.sleep(0.1)\n"
    poll_return = (
        "async def f():\n    while True:\n        try:\n            return await get()\n"
        "        except OSError:\n            await trio.sleep(0.1)\n"
    )
    pacing = "async def f():\n    while True:\n        await send()\n        await trio.sleep(0.1)\n"
    paced_for = (
        "async def f():\n    for _ in range(5):\n        for x in xs:\n            break\n"
        "        await trio.sleep(0.1)\n"
    )
    nested_def = "def f():\n    while x:\n        def g():\n            time.sleep(1)\n"
    assert [line for line, _ in polling_loops(poll)] == [2]
    assert [line for line, _ in polling_loops(poll_break)] == [2]
    assert [line for line, _ in polling_loops(poll_return)] == [2]
    assert polling_loops(pacing) == [] and polling_loops(paced_for) == [] and polling_loops(nested_def) == []


def test_no_hand_written_polling_loop_in_the_tests() -> None:
    found = []
    used = set()
    for path in sorted(TESTS.rglob("*.py")):
        name = path.relative_to(TESTS).as_posix()
        for line, text in polling_loops(path.read_text()):
            if (name, text) in ALLOWED:
                used.add((name, text))
            else:
                found.append(f"{name}:{line}: {text}")
    assert found == [], "use wait_until / wait_until_sync (tests/support/waiting.py) instead of:\n" + "\n".join(found)
    assert used == set(ALLOWED), f"allowed loops that are gone (remove them from ALLOWED): {set(ALLOWED) - used}"
