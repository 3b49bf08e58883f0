"""Quota admission over a chain of groups: check every level, then reserve at every level.

One ``GroupBudget`` per group holds what that group (with everything below it) is using now:
requests in the sliding minute, settled tokens in the sliding minute and in the UTC day, the
requests in flight and the tokens they reserved. Every request's figures are added to its
key's group *and every ancestor*, whether or not a level has a quota, so a quota set later
starts from the real history of this daemon rather than from zero.

What counts where:
- requests/minute: +1 at admission, at the admission time; ``give_back`` takes it back.
- tokens/minute and tokens/day: an admitted request *reserves* its estimate, held outside the
  time windows while it runs (so a long generation never "expires" its reservation); ``settle``
  drops the reservation and adds the real tokens (prompt + completion) at the settle time.
- concurrent requests: +1 at admission, -1 at settle or give_back.

Admission is one synchronous call with no ``await`` between the check and the reservation, so
under trio (one thread) no other request can slip in between: limits are exact under any
concurrency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from ..api_errors import ClientApiError
from ..store import Quota
from .windows import DayCounter, SlidingWindow

# Limit names as they appear in 429 messages and in the Quota record.
CONCURRENT = "concurrent_requests"
RPM = "requests_per_minute"
TPM = "tokens_per_minute"
TPD = "tokens_per_day"


class GroupBudget:
    __slots__ = ("day_tokens", "group_id", "in_flight", "label", "minute_tokens", "quota", "requests", "reserved")

    def __init__(self, group_id: str, label: str = "", quota: Quota | None = None) -> None:
        self.group_id = group_id
        self.label = label or group_id
        self.quota = quota
        self.requests = SlidingWindow()
        self.minute_tokens = SlidingWindow()
        self.day_tokens = DayCounter()
        self.in_flight = 0
        self.reserved = 0

    def refusals(self, now: float, estimated: int) -> list[QuotaRefusal]:
        """Every limit of this group that has no room for one more request of ``estimated`` tokens."""
        q = self.quota
        if q is None:
            return []
        found: list[QuotaRefusal] = []
        limit = q.concurrent_requests
        if limit is not None and self.in_flight + 1 > limit:
            # Nothing tells when a running request ends; one second is a polite first retry.
            found.append(self._refusal(CONCURRENT, limit, self.in_flight, 1, 1.0))
        limit = q.requests_per_minute
        if limit is not None:
            used = self.requests.total(now)
            if used + 1 > limit:
                wait = self.requests.seconds_until_freed(now, used + 1 - limit)
                found.append(self._refusal(RPM, limit, used, 1, wait))
        limit = q.tokens_per_minute
        if limit is not None:
            settled = self.minute_tokens.total(now)
            used = settled + self.reserved
            if used + estimated > limit:
                if estimated > limit:
                    wait = None
                else:
                    # Settled tokens leave the window by themselves; reservations leave when
                    # their requests finish, which nothing predicts: then retry soon.
                    wait = self.minute_tokens.seconds_until_freed(now, used + estimated - limit)
                    wait = 1.0 if wait is None else wait
                found.append(self._refusal(TPM, limit, used, estimated, wait))
        limit = q.tokens_per_day
        if limit is not None:
            settled = self.day_tokens.total(now)
            used = settled + self.reserved
            if used + estimated > limit:
                if estimated > limit:
                    wait = None
                elif settled + estimated > limit:
                    wait = DayCounter.seconds_until_reset(now)
                else:
                    wait = 1.0
                found.append(self._refusal(TPD, limit, used, estimated, wait))
        return found

    def _refusal(self, limit_name: str, limit: int, used: int, requested: int, wait: float | None) -> QuotaRefusal:
        # A limit of 0 pauses the group for that kind: no wait helps, and the message says so.
        retry = None if wait is None or limit == 0 else max(1, math.ceil(wait))
        return QuotaRefusal(self.group_id, self.label, limit_name, limit, used, requested, retry)


@attrs.frozen
class QuotaRefusal:
    """Why a request was refused: which group, which limit, and when a retry may succeed.

    ``retry_after`` is None when no retry can succeed: the request alone asks for more tokens
    than the limit allows, or the limit is 0 (the group is paused for that kind).
    """

    group_id: str
    group_label: str
    limit_name: str
    limit: int
    used: int
    requested: int
    retry_after: int | None

    def to_api_error(self) -> ClientApiError:
        what = self.limit_name.replace("_", " ")
        if self.limit == 0:
            return ClientApiError(
                429,
                f"Group '{self.group_label}' allows no {what.split(' per ')[0]} at present (its {what} limit is 0).",
                code="insufficient_quota",
            )
        if self.retry_after is None:
            return ClientApiError(
                429,
                f"Request too large for group '{self.group_label}': it asks for {self.requested} tokens, more than "
                f"the group's {what} limit of {self.limit}. Lower max_tokens or shorten the prompt.",
                code="request_too_large",
            )
        return ClientApiError(
            429,
            f"Rate limit reached for group '{self.group_label}' on {what}: limit {self.limit}, in use {self.used}, "
            f"requested {self.requested}. Retry after {self.retry_after} s.",
            code="rate_limit_exceeded",
            headers=(("retry-after", str(self.retry_after)),),
        )


def worst(refusals: Sequence[QuotaRefusal]) -> QuotaRefusal:
    """The refusal to report: one no retry can fix first, else the longest wait, so a client that
    honours Retry-After does not come back while another limit still blocks it."""
    return max(refusals, key=lambda r: math.inf if r.retry_after is None else r.retry_after)


def reserve(chain: Sequence[GroupBudget], now: float, estimated: int) -> tuple[int, ...]:
    """Admit one request against every budget in ``chain`` or raise ``ClientApiError(429)``.

    Returns the bucket each level counted the request in (what ``give_back`` needs; they differ
    only if the clock stepped back). Check everything first, reserve second: a refusal at the
    root must not leave reservations at the leaf.
    """
    refused: list[QuotaRefusal] = []
    for budget in chain:
        if budget.quota is not None:
            refused.extend(budget.refusals(now, estimated))
    if refused:
        raise worst(refused).to_api_error()
    seconds = []
    for budget in chain:
        budget.in_flight += 1
        budget.reserved += estimated
        seconds.append(budget.requests.add(now, 1))
    return tuple(seconds)


def settle(chain: Sequence[GroupBudget], now: float, estimated: int, tokens: int) -> None:
    """Replace a request's reservation with the ``tokens`` it really used."""
    for budget in chain:
        budget.in_flight -= 1
        budget.reserved -= estimated
        budget.minute_tokens.add(now, tokens)
        budget.day_tokens.add(now, tokens)


def give_back(chain: Sequence[GroupBudget], estimated: int, seconds: Sequence[int]) -> None:
    """Give back everything a failed request reserved, its request count included."""
    for budget, second in zip(chain, seconds, strict=True):
        budget.in_flight -= 1
        budget.reserved -= estimated
        budget.requests.remove(second, 1)
