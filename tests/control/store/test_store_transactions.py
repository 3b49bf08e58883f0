"""``llmgw_store_transactions_total``: one count per transaction, by kind, lease included."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmgw_control.store import SqlStore
from llmgw_control.store.transactions import register_transaction_metrics


def _scraped(registry: CollectorRegistry, kind: str) -> float:
    value = registry.get_sample_value("llmgw_store_transactions_total", {"kind": kind})
    assert value is not None
    return value


async def test_each_transaction_is_counted_once_by_kind(store: SqlStore) -> None:
    registry = CollectorRegistry()
    assert register_transaction_metrics(registry, store) is not None
    read0, write0 = _scraped(registry, "read"), _scraped(registry, "write")

    await store.revisions()  # one read transaction
    assert (_scraped(registry, "read"), _scraped(registry, "write")) == (read0 + 1, write0)
    await store.create_group("g1", None)  # one write transaction, however many statements
    assert (_scraped(registry, "read"), _scraped(registry, "write")) == (read0 + 1, write0 + 1)
    # The lease runs on a connection of its own on PostgreSQL and is counted with the rest.
    await store.lease.try_acquire("a", "http://a:8080", ttl=30)
    await store.lease.current()
    assert (_scraped(registry, "read"), _scraped(registry, "write")) == (read0 + 2, write0 + 2)


def test_a_store_without_counts_registers_nothing() -> None:
    registry = CollectorRegistry()
    assert register_transaction_metrics(registry, object()) is None
    assert registry.get_sample_value("llmgw_store_transactions_total", {"kind": "read"}) is None
