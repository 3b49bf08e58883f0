"""``/debug/tasks`` and ``/debug/gc`` on the admin listener: what a stuck or slow daemon is doing.

The equivalent of a pprof goroutine dump for trio: every task from the root down, by nursery,
each with the stack it is suspended in (``Task.iter_await_frames``: the frames of the coroutine
chain it awaits, outermost first). Served only by the admin app, so the admin key guard (off
loopback) covers them as it covers the rest; the client port forwards only ``/admin/api/v1/``
to that app, so they are not reachable there.

Both are bounded: a daemon with 10,000 node connections has tens of thousands of tasks, and the
dump must not become the thing that stalls it.
"""

from __future__ import annotations

import gc
from typing import Any

import trio
from quart import Response, jsonify, request
from quart_trio import QuartTrio

from .api.core import error_body

# Tasks in one dump: a control daemon runs ~5 per node connection and ~3 per request in flight;
# 20,000 covers thousands of both, and past it the dump says how many it left out.
MAX_TASKS = 20_000
# Frames per task: trio's own machinery is ~10 deep under an application's await chain.
MAX_FRAMES = 64


def _stack(task: trio.lowlevel.Task) -> list[str]:
    frames = []
    for frame, lineno in task.iter_await_frames():
        code = frame.f_code
        frames.append(f"{code.co_filename}:{lineno} in {code.co_qualname}")
        if len(frames) >= MAX_FRAMES:
            frames.append("...")
            break
    return frames


def task_tree() -> dict[str, Any]:
    """The task tree from trio's root task: ``{"task": ..., "count": n, "omitted": m}``."""
    seen = [0, 0]

    def walk(task: trio.lowlevel.Task) -> dict[str, Any]:
        seen[0] += 1
        nurseries = []
        for nursery in task.child_nurseries:
            children = []
            for child in nursery.child_tasks:
                if seen[0] >= MAX_TASKS:
                    seen[1] += 1
                    continue
                children.append(walk(child))
            nurseries.append(children)
        return {"name": task.name, "stack": _stack(task), "nurseries": nurseries}

    # The recursion is as deep as nurseries nest (a few dozen levels), not as long as the task count.
    root_task = trio.lowlevel.current_root_task()
    assert root_task is not None, "called from inside trio"
    return {"task": walk(root_task), "count": seen[0], "omitted": seen[1]}


def task_tree_text(tree: dict[str, Any]) -> str:
    lines: list[str] = []

    def show(node: dict[str, Any], depth: int) -> None:
        pad = "  " * depth
        lines.append(f"{pad}{node['name']}")
        lines.extend(f"{pad}    {frame}" for frame in node["stack"])
        for children in node["nurseries"]:
            for child in children:
                show(child, depth + 1)

    show(tree["task"], 0)
    lines.append(f"{tree['count']} task(s)" + (f", {tree['omitted']} omitted" if tree["omitted"] else ""))
    return "\n".join(lines) + "\n"


def gc_state() -> dict[str, Any]:
    return {
        "enabled": gc.isenabled(),
        # Allocations minus deallocations since each generation was last collected.
        "count": list(gc.get_count()),
        "thresholds": list(gc.get_threshold()),
        # Per generation: collections, objects collected, uncollectable.
        "stats": gc.get_stats(),
        # Objects moved to the permanent generation by gc.freeze (llmgw_shared.gcpause).
        "frozen": gc.get_freeze_count(),
    }


def register_debug_views(app: QuartTrio) -> None:
    @app.get("/debug/tasks")
    async def debug_tasks() -> Any:
        fmt = request.args.get("format", "json")
        if set(request.args) - {"format"} or fmt not in ("json", "text"):
            return error_body(400, "invalid_request", "the only parameter is format=json|text", "format")
        tree = task_tree()
        if fmt == "text":
            return Response(task_tree_text(tree), content_type="text/plain; charset=utf-8")
        return jsonify(tree)

    @app.get("/debug/gc")
    async def debug_gc() -> Any:
        if request.args:
            return error_body(400, "invalid_request", "no parameters are taken", next(iter(request.args)))
        return jsonify(gc_state())
