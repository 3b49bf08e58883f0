"""How many transactions this process ran against its store, by kind: the coordination cost.

Every query, lease renewal and migration reaches the database through ``run_transaction``, the
one place that counts, so ``llmgw_store_transactions_total`` (docs/metrics.md) is the number of
transactions the daemon started, whatever they did. On PostgreSQL one transaction is a few
network round trips (BEGIN, its statements, COMMIT); on SQLite none leave the host. Counted when
the transaction is started, not when it commits: a failed or cancelled one cost the database too.

Plain integers, read at scrape time by ``TransactionCollector``: the hot path pays one addition.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import TypeVar

import attrs
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from .backend import Backend, Tx

T = TypeVar("T")


@attrs.define
class TransactionCounts:
    read: int = 0
    write: int = 0

    def count(self, *, write: bool) -> None:
        if write:
            self.write += 1
        else:
            self.read += 1


async def run_transaction(backend: Backend, counts: TransactionCounts, fn: Callable[[Tx], T], *, write: bool) -> T:
    """``backend.run(fn, write=write)``, counted once in ``counts``."""
    counts.count(write=write)
    return await backend.run(fn, write=write)


class TransactionCollector(Collector):
    """Exposes a store's ``TransactionCounts`` as ``llmgw_store_transactions_total{kind}``."""

    def __init__(self, counts: TransactionCounts) -> None:
        self.counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "llmgw_store_transactions",
            "Transactions this process started on its store, by kind (read, write).",
            labels=["kind"],
        )
        family.add_metric(["read"], self.counts.read)
        family.add_metric(["write"], self.counts.write)
        yield family


# One collector per registry: control run twice in one process on one registry (tests) re-points
# the existing collector at the new store instead of failing on a duplicate series.
_registered: weakref.WeakKeyDictionary[CollectorRegistry, TransactionCollector] = weakref.WeakKeyDictionary()


def register_transaction_metrics(registry: CollectorRegistry, store: object) -> TransactionCollector | None:
    """Expose ``store``'s transaction counts on ``registry`` (None: a store that keeps none, a test fake)."""
    counts = getattr(store, "transactions", None)
    if not isinstance(counts, TransactionCounts):
        return None
    collector = _registered.get(registry)
    if collector is None:
        collector = _registered[registry] = TransactionCollector(counts)
        registry.register(collector)
    else:
        collector.counts = counts
    return collector
