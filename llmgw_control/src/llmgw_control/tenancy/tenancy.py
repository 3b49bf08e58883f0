"""Keys, groups, quotas and usage over the store, as one daemon opens them (``open_tenancy``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import trio

from llmgw_shared.logs import get_logger
from llmgw_shared.threads import DISK

from ..store import KEY_DIGEST_SECRET, Store, cluster_secret, is_postgres_url, open_store
from .admission import TenancyAdmission
from .keys import KeyDigester, load_or_create_server_secret
from .service import TenancyService
from .slices import SliceBook
from .state import TenancyState
from .usage import UsageAccumulator, UsageFlusher

log = get_logger(__name__)

# How long a stop waits for the last usage batch to be written before the store closes: the
# store's own statement timeout bounds one write, and a store that is down must not hold the stop.
_LAST_FLUSH_SECONDS = 10


@attrs.define
class Tenancy:
    """Keys, groups, quotas and usage, for the gateway, the admin API and tests."""

    store: Store
    state: TenancyState
    usage: UsageAccumulator
    service: TenancyService
    admission: TenancyAdmission


def quotas_shared(location: str, *, worker: bool) -> bool:
    """Whether other processes admit requests over the store at ``location``, so that every limit
    must hold for their sum (leased slices, slices.py) rather than for each process.

    On PostgreSQL any daemon may join at any time. A worker of ``workers = N`` (``worker``) is
    one of N daemons on the same store, whichever it is: its siblings share its SQLite file, and
    a restarted worker must see what its dead predecessor spent. Only a daemon alone on its
    SQLite file keeps the exact, I/O-free admission of budget.py. The one place this is decided.
    """
    return worker or is_postgres_url(location)


@asynccontextmanager
async def open_tenancy(location: str, data_dir: Path, *, shared: bool) -> AsyncIterator[Tenancy]:
    """The store at ``location`` and, over it, the tenancy state: loaded before the first request
    is admitted. Usage counted since the last batch is written before the store closes.

    ``shared``: whether other daemons (or worker processes) admit requests over the same store
    (``quotas_shared``). No default: a caller that forgot would let each process enforce every
    limit on its own.
    """
    if not is_postgres_url(location):
        await DISK.run(partial(data_dir.mkdir, parents=True, exist_ok=True))
    async with open_store(location) as store, trio.open_nursery() as nursery:
        if is_postgres_url(location):
            # Every daemon on this database must check the same digests: the secret lives there.
            secret = await cluster_secret(store, KEY_DIGEST_SECRET, data_dir / "key-secret")
        else:
            secret = await DISK.run(load_or_create_server_secret, data_dir / "key-secret")
        state = TenancyState(store, KeyDigester(secret))
        usage = UsageAccumulator()
        flusher = UsageFlusher(store, usage)
        await nursery.start(state.run)
        await nursery.start(flusher.run)
        book = None
        if shared:
            book = SliceBook(store, clock=state.clock)
            await nursery.start(book.run)
            log.info(
                "quotas are shared with the other daemons on this store (leased slices)", extra={"holder": book.holder}
            )
        if state.open:
            log.warning("no API keys exist: the gateway is open to every request (create a key to close it)")
        try:
            admission = TenancyAdmission(state, usage, book)
            yield Tenancy(store, state, usage, TenancyService(store, state, usage), admission)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(_LAST_FLUSH_SECONDS):
                await flusher.flush_once()
            nursery.cancel_scope.cancel()
