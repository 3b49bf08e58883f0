"""How long a standby takes to see a published replica view on PostgreSQL: NOTIFY vs the poll.

Starts a throwaway PostgreSQL (``postgres.py``), runs two followers side by side on one store,
one with LISTEN/NOTIFY (the default on PostgreSQL) and one that polls every ``FOLLOW_EVERY``
(what SQLite does, and what PostgreSQL did before), and publishes ``--samples`` views a random
0-0.5 s apart (so the poll's phase is random). For each follower it prints p50 and max of the
time from the call of ``publish_view`` (its commit included) to the replica appearing in its
router (checked every millisecond). The leader's own ``PUBLISH_EVERY`` batching (up to 0.25 s)
comes on top of both.

    .venv/bin/python tools/llmgw_dev/view_delay.py --samples 20

A printout for docs/performance.md, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from llmgw_control.fleet.view import ViewFollower
from llmgw_control.gateway.replicas import ReplicaSet
from llmgw_control.store import PublishedReplica, PublishedReplicas, SqlStore, ViewListener, connect_store
from llmgw_dev.postgres import PostgresServer

# A sample that takes longer than this is lost (reported, not waited for).
_SAMPLE_LIMIT = 10.0


class _PollOnly:
    """The store with its notifications hidden: the follower falls back to polling."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store

    async def replica_view(self) -> PublishedReplicas | None:
        return await self._store.replica_view()

    async def publish_view(self, epoch: int, replicas: list[PublishedReplica]) -> int | None:
        return await self._store.publish_view(epoch, replicas)

    def view_listener(self) -> ViewListener | None:
        return None


async def _seen(replicas: ReplicaSet, replica_id: str, start: float) -> float:
    with trio.fail_after(_SAMPLE_LIMIT):
        # The router has no "changed" event to wait on; a 1 ms check is the resolution wanted.
        while replicas.get(replica_id) is None:  # noqa: ASYNC110
            await trio.sleep(0.001)
    return trio.current_time() - start


async def measure(url: str, samples: int) -> dict[str, list[float]]:
    store = await connect_store(url)
    try:
        followers = {"notify": ReplicaSet(), "poll": ReplicaSet()}
        notify = ViewFollower(store, followers["notify"], lambda rid: "k")
        poll = ViewFollower(_PollOnly(store), followers["poll"], lambda rid: "k")
        delays: dict[str, list[float]] = {name: [] for name in followers}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(notify.run)
            nursery.start_soon(poll.run)
            with trio.fail_after(_SAMPLE_LIMIT):
                while notify.listener is None or notify.listener.connects < 1 or notify.reads < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)  # LISTEN in place and its read done: what follows is heard
            for i in range(samples):
                await trio.sleep(random.uniform(0.0, 0.5))
                replica_id = f"r{i}"
                start = trio.current_time()
                await store.publish_view(
                    1, [PublishedReplica(id=replica_id, profile_key="m", url="http://h:1", slots=1)]
                )
                async with trio.open_nursery() as waits:
                    for name, replicas in followers.items():

                        async def one(
                            name: str = name,
                            replicas: ReplicaSet = replicas,
                            replica_id: str = replica_id,
                            start: float = start,
                        ) -> None:
                            delays[name].append(await _seen(replicas, replica_id, start))

                        waits.start_soon(one)
            nursery.cancel_scope.cancel()
        return delays
    finally:
        await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    with PostgresServer.start() as server:
        url = server.create_database("view_delay")
        delays = trio.run(measure, url, args.samples)
    for name, values in delays.items():
        ms = sorted(v * 1000 for v in values)
        print(f"{name:7s} n={len(ms)} p50={statistics.median(ms):.1f} ms max={ms[-1]:.1f} ms min={ms[0]:.1f} ms")


if __name__ == "__main__":
    main()
