"""What the gateway calls on every request: ``admit`` before forwarding, then ``settle`` or ``give_back``.

Everything here is synchronous and in memory (a few microseconds): no I/O, no ``await``, so
there is no point where another request could run between checking the quotas and reserving
them. Use::

    ticket = admission.admit(authorization, model, estimated_tokens=max_tokens + prompt_estimate)
    try:
        ...forward...
        ticket.settle(usage.prompt_tokens, usage.completion_tokens)
    finally:
        ticket.give_back()  # a no-op after settle; gives everything back after a failure

A ticket is finished by its first ``settle`` or ``give_back``; later calls do nothing, so the
pattern above can never count a request twice or give back more than it took.
"""

from __future__ import annotations

import contextlib
import time
from types import TracebackType
from typing import Protocol, Self

import trio

from llmgw_shared.logs import get_logger

from ..api_errors import ClientApiError
from ..priority import Priority
from .budget import GroupBudget, give_back, reserve, settle, worst
from .slices import LeaseShort, SliceBook, Take
from .state import TenancyState
from .usage import UsageAccumulator
from .windows import Clock

log = get_logger(__name__)


class Ticket(Protocol):
    key_id: str | None
    group_id: str | None
    # Orders the request among others waiting for a replica slot (the group's, inherited).
    priority: Priority

    def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The engine's real usage: replaces the reservation, and is recorded as usage."""
        ...

    def give_back(self) -> None:
        """The request failed or was cancelled: give back what was reserved."""
        ...


class Admission(Protocol):
    def authenticate(self, authorization: str | None) -> frozenset[str] | None:
        """Raise ClientApiError(401) when a key is required and this one is not usable.

        Returns the models the key may use (its allow-list), or None when it may use every model
        (or no key is required): what ``/v1/models`` and a 404's list of models may show it.
        """
        ...

    def admit(self, authorization: str | None, model: str, *, estimated_tokens: int) -> Ticket:
        """Admit a request or raise ``ClientApiError`` (401, 403, 429; 503 before tenancy has loaded)."""
        ...


def _count(value: int) -> int:
    # Engines report ints; anything odd must not raise inside the gateway's ``finally``.
    return value if isinstance(value, int) and value > 0 else 0


class _TicketBase:
    __slots__ = ("_clock", "_done", "_usage", "group_id", "key_id", "model", "priority")

    def __init__(
        self,
        usage: UsageAccumulator,
        clock: Clock,
        model: str,
        key_id: str | None,
        group_id: str | None,
        priority: Priority = Priority.INTERACTIVE,
    ) -> None:
        self._usage = usage
        self._clock = clock
        self._done = False
        self.model = model
        self.key_id = key_id
        self.group_id = group_id
        self.priority = priority

    @property
    def finished(self) -> bool:
        return self._done

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.give_back()

    def give_back(self) -> None:
        self._done = True


class OpenTicket(_TicketBase):
    """A request let in without a key: only its usage by model is recorded."""

    __slots__ = ()

    def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        if self._done:
            return
        self._done = True
        self._usage.record(self._clock(), "", "", self.model, _count(prompt_tokens), _count(completion_tokens))


class TenancyTicket(_TicketBase):
    """A request admitted with a key: holds its reservation in every group of its chain (and, when
    the store is shared, what it spent from this daemon's slices: ``takes``)."""

    __slots__ = ("_book", "_chain", "_estimated", "_seconds", "_takes")

    def __init__(
        self,
        usage: UsageAccumulator,
        clock: Clock,
        model: str,
        key_id: str,
        group_id: str,
        chain: tuple[GroupBudget, ...],
        estimated: int,
        seconds: tuple[int, ...],
        priority: Priority = Priority.INTERACTIVE,
        book: SliceBook | None = None,
        takes: tuple[Take, ...] = (),
    ) -> None:
        super().__init__(usage, clock, model, key_id, group_id, priority)
        self._chain = chain
        self._estimated = estimated
        self._seconds = seconds
        self._book = book
        self._takes = takes

    def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        if self._done:
            return
        self._done = True
        prompt, completion = _count(prompt_tokens), _count(completion_tokens)
        now = self._clock()
        settle(self._chain, now, self._estimated, prompt + completion)
        if self._book is not None:
            self._book.settle(self._takes, self._estimated, prompt + completion)
        assert self.key_id is not None and self.group_id is not None
        self._usage.record(now, self.key_id, self.group_id, self.model, prompt, completion)

    def give_back(self) -> None:
        if self._done:
            return
        self._done = True
        give_back(self._chain, self._estimated, self._seconds)
        if self._book is not None:
            self._book.give_back(self._takes)

    def __del__(self) -> None:
        # A safety net, not the protocol: a ticket dropped unfinished (a bug in the caller)
        # would otherwise hold its concurrency slot and reservation for the life of the daemon,
        # the classic "limit stuck at full" bug. CPython frees it as the last reference goes.
        if not self._done:
            self.give_back()
            # At interpreter exit logging may be gone; giving back is what matters.
            with contextlib.suppress(Exception):
                log.warning(
                    "an admission ticket was dropped without settle or give_back; gave it back",
                    extra={"key_id": self.key_id, "group_id": self.group_id, "model": self.model},
                )


class OpenAdmission:
    """No tenancy at all (no store, or no keys configured): admit everything, record usage by model."""

    def __init__(self, usage: UsageAccumulator, *, clock: Clock = time.time) -> None:
        self.usage = usage
        self.clock = clock

    def authenticate(self, authorization: str | None) -> frozenset[str] | None:
        return None

    def admit(self, authorization: str | None, model: str, *, estimated_tokens: int) -> OpenTicket:
        return OpenTicket(self.usage, self.clock, model, None, None)


class TenancyAdmission:
    """Keys, allow-lists and quotas over the group tree, from a loaded ``TenancyState``.

    While no key exists at all it behaves like ``OpenAdmission`` (the state logs when that
    changes); once one exists, every request needs a usable key.
    """

    def __init__(self, state: TenancyState, usage: UsageAccumulator, book: SliceBook | None = None) -> None:
        self.state = state
        self.usage = usage
        self.clock = state.clock
        # Set when the store is shared by several daemons: limits then hold for their sum.
        self.book = book

    def authenticate(self, authorization: str | None) -> frozenset[str] | None:
        if self.state.loaded and not self.state.open:
            return self.state.authenticate(authorization).models
        return None

    def admit(self, authorization: str | None, model: str, *, estimated_tokens: int) -> OpenTicket | TenancyTicket:
        state = self.state
        if not state.loaded:
            # Never fall back to "open" because the keys are not known yet.
            raise ClientApiError(
                503,
                "The gateway is starting: API keys are not loaded yet.",
                code="not_ready",
                headers=(("retry-after", "1"),),
            )
        if state.open:
            return OpenTicket(self.usage, self.clock, model, None, None)
        key = state.authenticate(authorization)
        if key.models is not None and model not in key.models:
            raise ClientApiError(
                403,
                f"The API key '{key.name}' may not use the model '{model}'.",
                code="model_not_allowed",
                param="model",
            )
        estimated = _count(estimated_tokens)
        chain = state.chain(key.group_id)
        now = self.clock()
        book = self.book
        if book is None:
            seconds = reserve(chain, now, estimated)
            return TenancyTicket(
                self.usage,
                self.clock,
                model,
                key.id,
                key.group_id,
                chain,
                estimated,
                seconds,
                state.priority(key.group_id),
            )
        # Shared store: this daemon's own windows first (their 429s say the most), then its slices
        # of the limits; nothing is spent anywhere until both have room. No await in between.
        for budget in chain:
            if budget.quota is not None and (refused := budget.refusals(now, estimated)):
                raise worst(refused).to_api_error()
        needs = book.check(chain, now, estimated)
        seconds = reserve(chain, now, estimated)
        takes = book.spend(needs)
        return TenancyTicket(
            self.usage,
            self.clock,
            model,
            key.id,
            key.group_id,
            chain,
            estimated,
            seconds,
            state.priority(key.group_id),
            book,
            takes,
        )


# A request that finds a slice short waits for at most this many renewals (each normally one
# store round trip) before its 429 is final: the first lease of a group, then a retry in case
# other requests took what the renewal brought.
_LEASE_ROUNDS = 3
# And never longer than this in all: a store that hangs must not hold requests beyond a few seconds.
_LEASE_WAIT_SECONDS = 3.0


async def admit_waiting(
    admission: Admission, authorization: str | None, model: str, *, estimated_tokens: int
) -> Ticket:
    """``admission.admit``, but a request that finds this daemon's slice of a shared limit short
    waits for the slice's renewal instead of being refused while the group still has budget."""
    with trio.move_on_after(_LEASE_WAIT_SECONDS):
        for _ in range(_LEASE_ROUNDS):
            try:
                return admission.admit(authorization, model, estimated_tokens=estimated_tokens)
            except LeaseShort as short:
                if short.book is None:
                    raise  # refused at once: the slice came back short a moment ago
                await short.wait()
    # Out of rounds or time: this answer is final, whatever it is (a LeaseShort is a 429 or 503).
    return admission.admit(authorization, model, estimated_tokens=estimated_tokens)
