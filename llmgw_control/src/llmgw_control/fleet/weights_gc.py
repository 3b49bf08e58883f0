"""Which model files control tells a node to remove: pure, so every rule is tested directly.

* never a file in use: the node says a replica uses it, or control has a replica on that node
  (starting, running or draining) whose profile names it;
* a file no profile on the node needed for ``keep_for`` seconds goes (``reconciler.weights_keep_for``);
* when a download would not fit on the node's disk, the least recently used unused files go,
  as few as free enough; when even all of them would not, none (the start fails with the node's
  own "not enough disk" words instead of emptying the cache for nothing).
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw_shared.wire import WeightsHeld


def expired(held: Iterable[WeightsHeld], in_use: set[str], *, now: float, keep_for: float) -> list[str]:
    """Files unused for ``keep_for`` seconds (wall clock); none when ``keep_for`` is 0 (keep all)."""
    if keep_for <= 0:
        return []
    return sorted(w.sha256 for w in held if not w.in_use and w.sha256 not in in_use and now - w.last_used > keep_for)


def room_for_download(held: Iterable[WeightsHeld], in_use: set[str], *, need: int, free: int) -> list[str]:
    """The least recently used unused files to remove so ``need`` bytes fit in ``free`` ones."""
    if need <= free:
        return []
    out: list[str] = []
    freed = 0
    for weights in sorted(held, key=lambda w: (w.last_used, w.sha256)):
        if weights.in_use or weights.sha256 in in_use:
            continue
        out.append(weights.sha256)
        freed += weights.size
        if free + freed >= need:
            return out
    return []
