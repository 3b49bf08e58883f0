"""Quotas shared by several daemons: each spends, in memory, slices it leased from the store.

When the store is shared (PostgreSQL, or SQLite under several processes), a daemon's own
windows (budget.py) see only its own requests. So, on top of them, every limited (group, kind)
of a request's chain must have room in this daemon's *slice* of it: a part of the group's limit
leased from the store (store/ops_quota_slices.py, arithmetic in store/slice_math.py). Spending
is a counter in memory, on the request path, with no I/O; a background task (``SliceBook.run``)
re-leases a slice before it runs out or expires, and returns the ones nobody used for a while,
in one transaction for everything due at once.

A request that finds a slice short raises ``LeaseShort`` (a 429 with a way to wait):
``admit_waiting`` (admission.py) waits for the next renewal, which leases at least what the
waiting requests need if it is free, and tries again; only then is the 429 final.

Failure modes (docs/tenancy.md): while the store cannot be reached, a daemon keeps spending the
slices it holds until they expire (fail-open within what it was granted, which the others
already count), then refuses with 503 ``quota_unavailable``. A daemon that dies strands at
most its unspent slices, until their rows stop counting (the rest of the window).
"""

from __future__ import annotations

import math
import sys
import uuid
from collections.abc import Callable, Sequence

import attrs
import trio

from llmgw_shared.logs import get_logger

from ..api_errors import ClientApiError
from ..store import SliceAsk, SliceGrant, Store, StoreError
from ..store.slice_math import CONCURRENT, RPM, TPD, TPM
from .budget import GroupBudget
from .windows import Clock

log = get_logger(__name__)

# How long a grant may be spent for. Bounds how long a daemon that lost the store keeps admitting
# on what it holds, and how long a dead daemon's concurrent slots stay taken.
LEASE_TTL = 5.0
# Re-lease when a slice is down to this share of its grant (before it runs out, so a steady stream
# never waits), or when less than half its lease time is left while it is in use.
LOW_WATER = 0.25
# A slice nobody spent from for this long goes back, so an idle daemon does not hold budget the
# busy ones could use (and stops counting as a holder, which makes their slices larger).
IDLE_SECONDS = 2 * LEASE_TTL
# Without a wake-up, the renewer still looks this often (expiry approaching, idle slices).
TICK_SECONDS = LEASE_TTL / 5
# One renewal must not hang the renewer on a dead connection (the backend's statement timeout
# bounds it too; this is the scope that waiters see end).
RENEW_TIMEOUT = 10.0
# How long a slice that came back short (or could not be leased) refuses at once rather than
# asking again: at most one store round trip per second per exhausted slice.
BACKOFF_SECONDS = 1.0
# A grant for a kind the store says is not limited (the local quota cache is behind): unbounded.
_UNLIMITED = sys.maxsize // 4


class QuotaSlice:
    """This daemon's part of one group's limit of one kind."""

    __slots__ = (
        "backoff_until",
        "demand",
        "failed",
        "generation",
        "granted",
        "group_id",
        "holders",
        "kind",
        "last_used",
        "lease_id",
        "limit",
        "retry_after",
        "spent",
        "valid_until",
    )

    def __init__(self, group_id: str, kind: str) -> None:
        self.group_id = group_id
        self.kind = kind
        self.lease_id: str | None = None
        self.granted = 0
        # Units spent from this grant; for concurrent slots: slots in flight (they outlive grants).
        self.spent = 0
        self.valid_until = -math.inf
        self.demand = 0
        self.last_used = -math.inf
        self.generation = 0
        self.limit: int | None = None
        self.holders = 1
        self.retry_after: float | None = None
        self.failed = False
        # After a renewal that found nothing free (or failed), requests that find this slice short
        # are refused at once until then, instead of each asking the store again: a client
        # hammering an exhausted quota must not turn into a database round trip per request.
        self.backoff_until = -math.inf

    @property
    def free(self) -> int:
        return self.granted - self.spent

    def due(self, now: float) -> bool:
        """Whether the renewer should re-lease this slice now."""
        if self.demand > 0:
            return True
        if self.kind == CONCURRENT and self.spent > 0:
            # Slots in flight (a long stream) must stay leased, used lately or not: a lapsed
            # lease would let the other daemons hand the same slots out again.
            return self.free <= 0 or self.valid_until - now < LEASE_TTL / 2
        if now - self.last_used > IDLE_SECONDS:
            return False
        return self.free <= self.granted * LOW_WATER or self.valid_until - now < LEASE_TTL / 2

    def idle(self, now: float) -> bool:
        """Held, but nobody spent from it lately (and no slot is in flight): give it back."""
        return (
            self.lease_id is not None
            and now - self.last_used > IDLE_SECONDS
            and not (self.kind == CONCURRENT and self.spent > 0)
        )


@attrs.frozen
class LeaseShort(ClientApiError):
    """A slice had no room: the 429 (or 503) to send if waiting for a renewal does not help."""

    book: SliceBook | None = attrs.field(default=None, eq=False, repr=False)

    async def wait(self) -> None:
        if self.book is not None:
            await self.book.wait_renewal()


Take = tuple[QuotaSlice, int, int]  # (slice, its generation when spent, amount)


class SliceBook:
    """Every slice this daemon holds, the request-path checks, and the renewer (``run``)."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        holder: str | None = None,
        ttl: float = LEASE_TTL,
        label: Callable[[str], str] = str,
    ) -> None:
        self.store = store
        self.clock = clock
        self.holder = holder or uuid.uuid4().hex
        self.ttl = ttl
        self.label = label
        self.slices: dict[tuple[str, str], QuotaSlice] = {}
        self.renewals = 0  # store round trips made, for the coordination cost (bench, tests)
        self._wake = trio.Event()
        self._renewed = trio.Event()
        self._failing = False

    # --- the request path (synchronous, memory only) ------------------------------------------

    def check(self, chain: Sequence[GroupBudget], now: float, estimated: int) -> list[tuple[QuotaSlice, int]]:
        """What the request would spend from each slice, or ``LeaseShort`` if one has no room."""
        needs: list[tuple[QuotaSlice, int]] = []
        short: list[tuple[QuotaSlice, int, GroupBudget]] = []
        for budget in chain:
            quota = budget.quota
            if quota is None:
                continue
            for kind, amount in ((RPM, 1), (TPM, estimated), (TPD, estimated), (CONCURRENT, 1)):
                if getattr(quota, kind) is None or amount <= 0:
                    continue
                piece = self.slices.get((budget.group_id, kind))
                if piece is None:
                    piece = self.slices[(budget.group_id, kind)] = QuotaSlice(budget.group_id, kind)
                piece.last_used = now
                if now < piece.valid_until and piece.free >= amount:
                    needs.append((piece, amount))
                else:
                    short.append((piece, amount, budget))
        if short:
            if all(now < piece.backoff_until for piece, _, _ in short):
                raise self._refusal(short, now, waitable=False)
            for piece, amount, _ in short:
                piece.demand += amount
            self._wake.set()
            raise self._refusal(short, now, waitable=True)
        return needs

    def spend(self, needs: Sequence[tuple[QuotaSlice, int]]) -> tuple[Take, ...]:
        takes = []
        wake = False
        for piece, amount in needs:
            piece.spent += amount
            takes.append((piece, piece.generation, amount))
            if piece.free <= piece.granted * LOW_WATER:
                wake = True
        if wake:
            self._wake.set()
        return tuple(takes)

    def give_back(self, takes: Sequence[Take]) -> None:
        """A request failed: give back what it took, if the grant it took from is still current."""
        for piece, generation, amount in takes:
            if piece.kind == CONCURRENT or piece.generation == generation:
                piece.spent = max(0, piece.spent - amount)

    def settle(self, takes: Sequence[Take], estimated: int, tokens: int) -> None:
        """A request ended: its slot comes back, and its token estimate is corrected to the truth."""
        for piece, generation, amount in takes:
            if piece.kind == CONCURRENT:
                piece.spent = max(0, piece.spent - amount)
            elif piece.kind in (TPM, TPD):
                extra = tokens - estimated
                if extra > 0:
                    # Used more than reserved: charged to whatever grant is current, so the store
                    # learns the truth at the next renewal.
                    piece.spent += extra
                elif extra < 0 and piece.generation == generation:
                    piece.spent = max(0, piece.spent + extra)

    def _refusal(self, short: list[tuple[QuotaSlice, int, GroupBudget]], now: float, *, waitable: bool) -> LeaseShort:
        book = self if waitable else None
        piece, amount, budget = short[0]
        if self._failing and now >= piece.valid_until:
            return LeaseShort(
                503,
                "The quota store cannot be reached, and this gateway's share of the group's "
                f"limits has run out: group '{budget.label}' cannot be admitted now.",
                code="quota_unavailable",
                headers=(("retry-after", "1"),),
                book=book,
            )
        what = piece.kind.replace("_", " ")
        retry = max(1, math.ceil(piece.retry_after)) if piece.retry_after is not None else 1
        limit = piece.limit if piece.limit is not None else getattr(budget.quota, piece.kind)
        return LeaseShort(
            429,
            f"Rate limit reached for group '{budget.label}' on {what}: limit {limit}, shared by "
            f"{piece.holders} gateway(s), requested {amount}. Retry after {retry} s.",
            code="rate_limit_exceeded",
            headers=(("retry-after", str(retry)),),
            book=book,
        )

    # --- renewing ---------------------------------------------------------------------------

    async def wait_renewal(self) -> None:
        """Until the next renewal attempt ends (whatever its outcome)."""
        await self._renewed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                with trio.move_on_after(TICK_SECONDS):
                    await self._wake.wait()
                self._wake = trio.Event()
                await self.renew_once()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(RENEW_TIMEOUT):
                await self.return_all()

    async def renew_once(self) -> None:
        """One transaction: re-lease what is due, return what is idle. Wakes every waiter."""
        now = self.clock()
        asks: list[tuple[QuotaSlice, SliceAsk]] = []
        for key, piece in list(self.slices.items()):
            if piece.due(now):
                asks.append((piece, self._ask(piece, renew=True)))
            elif piece.idle(now):
                asks.append((piece, self._ask(piece, renew=False)))
            elif piece.lease_id is None and now - piece.last_used > IDLE_SECONDS and piece.spent == 0:
                del self.slices[key]
        if not asks:
            self._wake_waiters()
            return
        try:
            await self._lease(asks, now)
        finally:
            self._wake_waiters()

    async def return_all(self) -> None:
        """Give every unspent slice back (a clean stop strands nothing)."""
        asks = [(p, self._ask(p, renew=False)) for p in self.slices.values() if p.lease_id is not None]
        if asks:
            try:
                await self._lease(asks, self.clock())
            except StoreError as exc:
                log.warning("could not return quota slices at stop (they count until they expire): %s", exc)

    def _ask(self, piece: QuotaSlice, *, renew: bool) -> SliceAsk:
        concurrent = piece.kind == CONCURRENT
        return SliceAsk(
            piece.group_id,
            piece.kind,
            close=piece.lease_id,
            spent=piece.spent,
            renew=renew,
            need=piece.demand,
            keep=piece.spent if concurrent else 0,
        )

    async def _lease(self, asks: list[tuple[QuotaSlice, SliceAsk]], sent_at: float) -> None:
        demand = {id(p): p.demand for p, _ in asks}
        # Freeze every grant being closed at what it has spent: the store is told that figure,
        # so a request admitted from the old grant while the lease is in flight would be counted
        # nowhere (seen: 11 admitted of 10 in the two-daemon burst). Requests meanwhile wait.
        frozen = {id(p): p.granted for p, a in asks if a.close is not None}
        for piece, ask in asks:
            if ask.close is not None:
                piece.granted = min(piece.granted, ask.spent)
        self.renewals += 1
        try:
            with trio.fail_after(RENEW_TIMEOUT):
                grants = await self.store.lease_slices(self.holder, [a for _, a in asks], ttl=self.ttl)
        except (StoreError, trio.TooSlowError) as exc:
            for piece, ask in asks:
                if ask.close is not None and not isinstance(exc, trio.TooSlowError):
                    # The transaction failed, so the old grant is still whole in the store: keep
                    # spending it until it expires (fail-open within the slice held). After a
                    # timeout the abandoned statement may yet commit the close: stay frozen.
                    piece.granted = max(piece.granted, frozen[id(piece)])
                piece.failed = True
                # Waiters are refused (503 once the slice expires); they re-ask when they retry.
                piece.demand = 0
                piece.backoff_until = sent_at + BACKOFF_SECONDS
            if not self._failing:
                log.warning("cannot lease quota slices (admitting within the slices held until they expire): %s", exc)
            self._failing = True
            return
        if self._failing:
            log.info("quota slices are leasing again")
        self._failing = False
        for (piece, ask), grant in zip(asks, grants, strict=True):
            self._apply(piece, ask, grant, sent_at, demand[id(piece)])

    def _apply(self, piece: QuotaSlice, ask: SliceAsk, grant: SliceGrant, sent_at: float, demand: int) -> None:
        piece.failed = False
        # Requests that arrived while the lease was in flight asked for more: keep their demand.
        piece.demand = max(0, piece.demand - demand)
        piece.limit = grant.limit
        piece.holders = grant.holders
        piece.retry_after = grant.retry_after
        short = ask.renew and grant.amount - ask.keep < max(1, demand)
        wait = min(BACKOFF_SECONDS, grant.retry_after or BACKOFF_SECONDS)
        piece.backoff_until = sent_at + wait if short else -math.inf
        concurrent = piece.kind == CONCURRENT
        if grant.limit is None and ask.renew:
            # Not limited any more (the cache is behind the store): nothing to lease.
            piece.lease_id, piece.granted, piece.valid_until = None, _UNLIMITED, sent_at + self.ttl
            if not concurrent:
                piece.spent, piece.generation = 0, piece.generation + 1
            return
        if not concurrent:
            # A new grant starts empty; what the old one spent stays counted in the store.
            piece.spent = 0
            piece.generation += 1
        piece.lease_id = grant.lease_id
        piece.granted = grant.amount
        # Measured from when the ask was sent: the grant began no earlier by the database's
        # clock, so this side never believes it valid after the store stops counting it as spendable.
        piece.valid_until = sent_at + grant.ttl if grant.lease_id is not None else -math.inf

    def _wake_waiters(self) -> None:
        self._renewed.set()
        self._renewed = trio.Event()
