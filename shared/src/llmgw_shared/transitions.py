"""A lifecycle: a StrEnum of states, one table of the transitions that can happen, and ``move``.

Every lifecycle in both daemons (a replica's status, a node's liveness, a mirror pull, a capacity
run, an engine's install, a client exchange) is an instance of ``Lifecycle`` over its own StrEnum: the enum's values
are the strings stored in the database and sent on the wire, so a StrEnum member and its string
compare equal and serialise the same. The model is llama-swap's ``isValidTransition``
(proxy/process.go): one table, checked on every change, so an impossible transition is a bug a
test catches instead of a string nobody looks at. The tables are listed, and checked against the
code, in docs/architecture.md ("Lifecycles") and tests/test_lifecycles.py.

Staying in a state is always allowed except in a terminal one (a state with no way out): a
report that repeats itself is not a transition, but nothing leaves an end, not even for itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Generic, TypeVar

S = TypeVar("S", bound=StrEnum)


class ImpossibleTransition(RuntimeError):
    """Code asked for a transition its lifecycle's table forbids: a bug in that code."""


class Lifecycle(Generic[S]):
    """One lifecycle's table: where things start, and from each state the states they may go to."""

    def __init__(self, name: str, enum: type[S], start: Iterable[S], transitions: Mapping[S, Iterable[S]]) -> None:
        self.name = name
        self.enum = enum
        self.start = frozenset(start)
        self.transitions: dict[S, frozenset[S]] = {state: frozenset(to) for state, to in transitions.items()}
        # Every state of the enum has its row: a state the table forgot is a bug found at import.
        if set(self.transitions) != set(enum) or not self.start:
            raise ValueError(f"{name}: the table must have a row for every state of {enum.__name__}, and a start")
        self.states = frozenset(enum)
        self.terminal = frozenset(state for state, to in self.transitions.items() if not to)

    def allowed(self, current: S, new: S) -> bool:
        """Whether something may go from ``current`` to ``new``."""
        if current == new:
            return current not in self.terminal
        return new in self.transitions[current]

    def move(self, what: str, current: S, new: S) -> S:
        """``new`` when the table allows it; raises ``ImpossibleTransition`` (a bug) otherwise."""
        if not self.allowed(current, new):
            raise ImpossibleTransition(f"{self.name} {what}: {current} -> {new} cannot happen")
        return new

    def reachable(self) -> frozenset[S]:
        """Every state something can get to from a start state."""
        seen = set(self.start)
        todo = list(self.start)
        while todo:
            for state in self.transitions[todo.pop()] - seen:
                seen.add(state)
                todo.append(state)
        return frozenset(seen)

    def can_end(self, state: S) -> bool:
        """Whether a terminal state can be reached from ``state``."""
        seen, todo = {state}, [state]
        while todo:
            current = todo.pop()
            if current in self.terminal:
                return True
            for nxt in self.transitions[current] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return False

    def table(self) -> str:
        """The table as a Markdown list (docs/architecture.md carries it; a test keeps them equal)."""
        lines = [f"- start: {', '.join(f'`{s}`' for s in self._ordered(self.start))}"]
        for state in self._ordered(self.transitions):
            to = self._ordered(self.transitions[state])
            lines.append(f"- `{state}` → " + (", ".join(f"`{s}`" for s in to) if to else "(terminal)"))
        return "\n".join(lines)

    def _ordered(self, states: Iterable[S]) -> list[S]:
        return [state for state in self.enum if state in states]
