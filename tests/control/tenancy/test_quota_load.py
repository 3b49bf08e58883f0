"""Quotas at three levels (org → team → project) under concurrent load.

Many trio tasks admit, yield to each other at random points, and then settle with known token
counts, fail (release) or are cancelled, while a fake wall clock moves on by a fraction of a
second per request (several minutes in all, so every window rolls over many times). A ground
truth kept beside the admission code then shows, for every level: no 60-second interval ever
saw more admitted requests or settled tokens than its limit, no more requests were in flight at
once than allowed, the day's tokens stayed under the day limit, every reservation was given
back, and every token was counted exactly once, in the windows and in the stored usage.
"""

from __future__ import annotations

import random
from collections import defaultdict

import attrs
import trio
from control.tenancy.support import FakeClock, Tenancy, bearer, make_tree

from llmgw_control.api_errors import ClientApiError
from llmgw_control.store import Quota

QUOTAS = {
    "org": Quota(tokens_per_minute=9000, concurrent_requests=16, tokens_per_day=40_000),
    "team": Quota(requests_per_minute=25, tokens_per_minute=6000, concurrent_requests=6),
    "project": Quota(tokens_per_minute=2000, concurrent_requests=4),
    "other_team": Quota(requests_per_minute=8),
}


@attrs.define
class Truth:
    """What really happened, recorded by the workers, per group (a request counts at every level)."""

    chains: dict[str, tuple[str, ...]]
    in_flight: dict[str, int] = attrs.field(factory=lambda: defaultdict(int))
    admitted: dict[str, list[float]] = attrs.field(factory=lambda: defaultdict(list))
    settled: dict[str, list[tuple[float, int]]] = attrs.field(factory=lambda: defaultdict(list))
    usage: dict[str, list[int]] = attrs.field(factory=lambda: defaultdict(lambda: [0, 0, 0]))
    refusals: dict[str, int] = attrs.field(factory=lambda: defaultdict(int))
    peak: dict[str, int] = attrs.field(factory=lambda: defaultdict(int))


def _max_in_any_minute(events: list[tuple[float, int]]) -> int:
    """The largest sum of amounts over any half-open 60-second interval [x, x + 60)."""
    events = sorted(events)
    best = total = lo = 0
    for hi in range(len(events)):
        total += events[hi][1]
        while events[hi][0] - events[lo][0] >= 60:
            total -= events[lo][1]
            lo += 1
        best = max(best, total)
    return best


async def _worker(
    tenancy: Tenancy, clock: FakeClock, auth: str, group: str, truth: Truth, rng: random.Random, requests: int
) -> None:
    chain = truth.chains[group]
    served = 0
    while served < requests:
        clock.advance(rng.uniform(0.0, 0.4))
        estimated = rng.randint(50, 400)
        try:
            ticket = tenancy.admission.admit(auth, "m", estimated_tokens=estimated)
        except ClientApiError as error:
            assert error.status == 429, error
            limit = error.message.split(" on ")[-1].split(":")[0]
            truth.refusals[limit] += 1
            if limit == "tokens per day":
                return  # nothing more today
            await trio.lowlevel.checkpoint()
            continue
        served += 1
        admitted_at = clock()
        for g in chain:
            truth.in_flight[g] += 1
            truth.peak[g] = max(truth.peak[g], truth.in_flight[g])
        outcome = rng.random()
        released = True
        try:
            with trio.CancelScope() as scope:
                if outcome < 0.05:
                    scope.cancel()  # the client went away: the next checkpoint raises Cancelled
                for _ in range(rng.randint(0, 6)):
                    await trio.lowlevel.checkpoint()
                    clock.advance(rng.uniform(0.0, 0.1))
                if outcome < 0.15:
                    continue  # the engine failed: no usage
                # Engines never exceed max_tokens + prompt; often they use all of it.
                actual = estimated if rng.random() < 0.5 else rng.randint(0, estimated)
                prompt = rng.randint(0, actual)
                ticket.settle(prompt, actual - prompt)
                released = False
                for g in chain:
                    truth.settled[g].append((clock(), actual))
                    row = truth.usage[g]
                    row[0] += 1
                    row[1] += prompt
                    row[2] += actual - prompt
        finally:
            ticket.give_back()  # after settle: does nothing
            for g in chain:
                truth.in_flight[g] -= 1
                if not released:
                    truth.admitted[g].append(admitted_at)


async def test_no_level_is_ever_exceeded_and_nothing_is_counted_twice(tenancy: Tenancy, clock: FakeClock) -> None:
    service = tenancy.service
    tree = await make_tree(service)
    ids = {"org": tree.org, "team": tree.team, "project": tree.project, "other_team": tree.other_team}
    for name, quota in QUOTAS.items():
        await service.set_quota(ids[name], quota)
    # Keys at every depth: requests from each meet at the shared ancestors.
    keys = {
        "project": await service.create_key(name="p", group_id=tree.project),
        "team": await service.create_key(name="t", group_id=tree.team),
        "other_team": await service.create_key(name="o", group_id=tree.other_team),
        "org": await service.create_key(name="r", group_id=tree.org),
    }
    by_id = {v: k for k, v in ids.items()}
    truth = Truth(chains={name: tuple(by_id[g] for g in tenancy.state.tree.ancestry(ids[name])) for name in keys})
    assert truth.chains["project"] == ("project", "team", "org")

    rng = random.Random(6)
    start = clock()
    async with trio.open_nursery() as nursery:
        for i in range(32):
            name = ("project", "project", "team", "other_team", "org")[i % 5]
            nursery.start_soon(
                _worker, tenancy, clock, bearer(keys[name].secret), name, truth, random.Random(rng.random()), 40
            )
    assert clock() - start > 240, "the run should span several minutes of fake time"

    for name, quota in QUOTAS.items():
        if quota.requests_per_minute is not None:
            worst = _max_in_any_minute([(t, 1) for t in truth.admitted[name]])
            assert 0 < worst <= quota.requests_per_minute, (name, worst)
        if quota.tokens_per_minute is not None:
            worst = _max_in_any_minute(truth.settled[name])
            assert 0 < worst <= quota.tokens_per_minute, (name, worst)
        if quota.concurrent_requests is not None:
            assert 0 < truth.peak[name] <= quota.concurrent_requests, name
        if quota.tokens_per_day is not None:
            assert sum(n for _, n in truth.settled[name]) <= quota.tokens_per_day
    # The limits were really in play (otherwise the test above proves nothing).
    for limit in ("requests per minute", "tokens per minute", "concurrent requests", "tokens per day"):
        assert truth.refusals[limit] > 0, (limit, dict(truth.refusals))

    # Every reservation given back; every settled token counted once at every level.
    for name, group_id in ids.items():
        budget = tenancy.state.budget(group_id)
        assert (budget.in_flight, budget.reserved) == (0, 0), name
        assert budget.day_tokens.total(clock()) == sum(n for _, n in truth.settled[name]), name

    await tenancy.usage.flush(tenancy.store)
    rollup = await service.usage_rollup(tree.org, include_pending=False)
    for name, group_id in ids.items():
        got = rollup[group_id]
        assert [got.requests, got.prompt_tokens, got.completion_tokens] == truth.usage[name], name
