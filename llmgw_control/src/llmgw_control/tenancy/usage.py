"""Usage accounting: counted in memory per (hour, key, group, model), written to the store in batches.

Nothing on the data path waits for the database: ``UsageAccumulator.record`` adds to a dict.
``UsageFlusher.run`` (one trio task in the daemon's nursery) writes the accumulated deltas with
one ``add_usage`` call every few seconds and once more at shutdown.

Never lost, never counted twice: a flush *takes* the pending deltas, and puts them back only if
the write failed because the store was away. A batch the store refuses for what is in it is
written again one row at a time, so one row out of range never holds back the others; that row
alone is logged and dropped. The write runs shielded from cancellation, so its outcome is always known: a
cancelled ``to_thread`` call could otherwise have committed while we were told it failed, and
the retry would count the batch twice. The store's own statement/busy timeout bounds how long
a shielded write can hold up shutdown. (One case stays ambiguous and is the store's to report:
PostgreSQL losing the connection *during* COMMIT; the retry may then double one batch.)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import trio

from llmgw_shared.logs import get_logger

from ..store import Store, StoreClosed, StoreError, StoreUnavailable, Usage

log = get_logger(__name__)

_HOUR = 3600
_Row = tuple[int, str, str, str]  # (hour index, key id, group id, model)


def hour_start(hour_index: int) -> datetime:
    return datetime.fromtimestamp(hour_index * _HOUR, UTC)


class UsageAccumulator:
    """Usage not yet written to the store. ``""`` as key/group id means an open gateway."""

    def __init__(self) -> None:
        self._pending: dict[_Row, list[int]] = {}

    def record(
        self,
        now: float,
        key_id: str,
        group_id: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        requests: int = 1,
    ) -> None:
        counts = self._pending.get(row := (int(now // _HOUR), key_id, group_id, model))
        if counts is None:
            self._pending[row] = [requests, prompt_tokens, completion_tokens]
        else:
            counts[0] += requests
            counts[1] += prompt_tokens
            counts[2] += completion_tokens

    def __len__(self) -> int:
        return len(self._pending)

    def pending(self) -> list[Usage]:
        """The deltas not yet written (for reports that must include the last seconds)."""
        return [_usage(row, counts) for row, counts in self._pending.items()]

    def _take(self) -> dict[_Row, list[int]]:
        taken, self._pending = self._pending, {}
        return taken

    def _put_back(self, taken: dict[_Row, list[int]]) -> None:
        for row, counts in taken.items():
            self.record(row[0] * _HOUR, row[1], row[2], row[3], counts[1], counts[2], counts[0])

    async def flush(self, store: Store) -> int:
        """Write every pending delta in one batch; returns the number of rows written.

        On failure the deltas are pending again (merged with whatever arrived meanwhile) and
        the store's error propagates.
        """
        taken = self._take()
        if not taken:
            return 0
        batch = [_usage(row, counts) for row, counts in taken.items()]
        try:
            with trio.CancelScope(shield=True):
                await store.add_usage(batch)
        except StoreError as exc:
            if isinstance(exc, StoreUnavailable | StoreClosed):
                self._put_back(taken)
                raise
            # The store refused the batch for what is in it (a count out of range, say), not
            # because it is away: one bad row must not hold back every other row, on this flush
            # and on every later one. Each row is tried on its own.
            return await self._flush_each(store, taken)
        except BaseException:
            self._put_back(taken)
            raise
        return len(batch)

    async def _flush_each(self, store: Store, taken: dict[_Row, list[int]]) -> int:
        """Write ``taken`` one row a transaction: rows the store refuses are dropped (logged), and
        should it go away meanwhile, the rows not yet written are pending again."""
        written = 0
        rows = list(taken.items())
        for index, (row, counts) in enumerate(rows):
            try:
                with trio.CancelScope(shield=True):
                    await store.add_usage([_usage(row, counts)])
            except StoreError as exc:
                if isinstance(exc, StoreUnavailable | StoreClosed):
                    self._put_back(dict(rows[index:]))
                    raise
                # Retrying it would fail the same way on every flush: it is logged whole, so
                # an operator can still account for it, and dropped.
                log.error(
                    "usage of key %r (group %r, model %r) refused by the store, dropped: %s",
                    row[1],
                    row[2],
                    row[3],
                    exc,
                    extra={
                        "hour": hour_start(row[0]).isoformat(),
                        "requests": counts[0],
                        "prompt_tokens": counts[1],
                        "completion_tokens": counts[2],
                    },
                )
            except BaseException:
                self._put_back(dict(rows[index:]))
                raise
            else:
                written += 1
        return written


def _usage(row: _Row, counts: list[int]) -> Usage:
    return Usage(hour_start(row[0]), row[1], row[2], row[3], counts[0], counts[1], counts[2])


class UsageFlusher:
    """The task that writes usage: every ``interval`` seconds, and once more when cancelled."""

    def __init__(self, store: Store, accumulator: UsageAccumulator, *, interval: float = 5.0) -> None:
        self.store = store
        self.accumulator = accumulator
        self.interval = interval
        self.failures = 0

    async def flush_once(self) -> bool:
        """One flush; a store error is logged and the deltas wait for the next one."""
        try:
            await self.accumulator.flush(self.store)
        except StoreError as exc:
            self.failures += 1
            log.warning(
                "could not write usage (kept for the next try): %s", exc, extra={"pending_rows": len(self.accumulator)}
            )
            return False
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await trio.sleep(self.interval)
                await self.flush_once()
        finally:
            # Shutdown: what the last seconds served must reach the store too.
            with trio.CancelScope(shield=True):
                await self.flush_once()


def merge(rows: Iterable[Usage]) -> list[Usage]:
    """Sum rows with the same (hour, key, group, model), sorted like the store's results."""
    merged: dict[tuple[datetime, str, str, str], list[int]] = {}
    for u in rows:
        counts = merged.setdefault((u.hour, u.key_id, u.group_id, u.model), [0, 0, 0])
        counts[0] += u.requests
        counts[1] += u.prompt_tokens
        counts[2] += u.completion_tokens
    return [
        Usage(k[0], k[1], k[2], k[3], v[0], v[1], v[2])
        for k, v in sorted(merged.items(), key=lambda item: (item[0][0], item[0][2], item[0][1], item[0][3]))
    ]
