"""The group tree in memory: parents, ancestry chains and subtrees, built from the store's rows."""

from __future__ import annotations

from collections.abc import Iterable

from ..store import Group


class GroupTree:
    """An immutable snapshot of the groups; rebuilt (not mutated) when the store's groups change."""

    def __init__(self, groups: Iterable[Group] = ()) -> None:
        self.groups: dict[str, Group] = {g.id: g for g in groups}
        self._children: dict[str, list[str]] = {}
        for g in self.groups.values():
            if g.parent_id is not None:
                self._children.setdefault(g.parent_id, []).append(g.id)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self.groups

    def __len__(self) -> int:
        return len(self.groups)

    def name(self, group_id: str) -> str:
        group = self.groups.get(group_id)
        return group.name if group is not None else group_id

    def path(self, group_id: str) -> str:
        """``org/team/project``: how a person recognises a group in an error message."""
        return "/".join(self.name(g) for g in reversed(self.ancestry(group_id)))

    def ancestry(self, group_id: str) -> tuple[str, ...]:
        """The group and its ancestors, nearest first, up to its root.

        The store refuses cycles; the ``seen`` guard only keeps a damaged table from hanging
        the data path.
        """
        chain = [group_id]
        seen = {group_id}
        group = self.groups.get(group_id)
        while group is not None and group.parent_id is not None and group.parent_id not in seen:
            chain.append(group.parent_id)
            seen.add(group.parent_id)
            group = self.groups.get(group.parent_id)
        return tuple(chain)

    def subtree(self, group_id: str) -> set[str]:
        """The group and every descendant."""
        found = {group_id}
        todo = [group_id]
        while todo:
            for child in self._children.get(todo.pop(), ()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return found
