"""Live traffic without Prometheus: the last 15 minutes of this daemon's requests, per model and
per replica, in 10-second buckets held in a ring (the dashboard's Models page draws them).

The data path's part is ``note``, called once per answered request from ``exchange.record``: it
finds the series' current bucket and bumps a few counters, no lock (the gateway and the admin
app share one trio thread) and no allocation but the occasional new bucket (once per series per
10 s). Time to first token goes into fixed bins, so p50/p95 are read from counts, not from kept
samples. Queue depth is the activator's own count of waiting requests, read as each request of
the model is recorded and again when the window is read, the peak kept per bucket.

Bounded: at most ``MAX_SERIES`` series (models and replicas together), each a ring of
``BUCKETS`` buckets; a new series past the cap replaces the one used least recently, and series
idle for the whole window are dropped when the window is read. Names are stored as the gateway
set them (configured profile keys, replica ids) and only ever leave as JSON strings.
"""

from __future__ import annotations

import os
import socket
import time
from bisect import bisect_left

import attrs

from .demand import WaitingRequests

BUCKET_SECONDS = 10
WINDOW_SECONDS = 15 * 60
BUCKETS = WINDOW_SECONDS // BUCKET_SECONDS
# Models and replicas together. A daemon serving 60 models with 3 replicas each fits; each series
# costs at most BUCKETS small buckets (about 40 KiB with their bins), so the whole window stays
# under about 10 MiB whatever the fleet does.
MAX_SERIES = 256
# Upper bounds (seconds) of the time-to-first-token bins, from a cached answer to the longest wait
# for a first byte (router.first_byte_timeout's 300 s); past the last is one overflow bin.
TTFT_BOUNDS = (
    0.025,
    0.05,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
# A short recent span for the headline figures (the rates "now"): the last 6 buckets.
RECENT_BUCKETS = 6


class _Bucket:
    __slots__ = ("errors", "queue", "requests", "tick", "tokens", "ttft")

    def __init__(self, tick: int) -> None:
        self.tick = tick
        self.requests = 0
        self.errors = 0
        self.tokens = 0
        self.queue = 0
        # Allocated with the first first-token time: most buckets of non-streaming series need none.
        self.ttft: list[int] | None = None


class _Series:
    __slots__ = ("last", "model", "ring")

    def __init__(self, model: str, tick: int) -> None:
        self.model = model
        self.last = tick
        self.ring: list[_Bucket | None] = [None] * BUCKETS

    def bucket(self, tick: int) -> _Bucket:
        self.last = tick
        slot = tick % BUCKETS
        bucket = self.ring[slot]
        if bucket is None or bucket.tick != tick:
            bucket = self.ring[slot] = _Bucket(tick)
        return bucket


@attrs.frozen
class LiveSummary:
    """The last minute: rates per second, first-token quantiles over its streamed answers."""

    requests_per_s: float
    errors: int
    tokens_per_s: float
    ttft_p50: float | None
    ttft_p95: float | None
    queue_depth: int


@attrs.frozen
class LiveSeries:
    """One model or replica. The lists hold one value per bucket of the window, oldest first (the
    first bucket starts at ``LiveTraffic.start``): plain arrays, so the whole window serialises
    in a few milliseconds on the daemon's one thread."""

    name: str = attrs.field(metadata={"doc": "The profile key, or the replica id."})
    model: str
    recent: LiveSummary
    requests: list[int]
    errors: list[int] = attrs.field(metadata={"doc": "Answers with a status of 500 or more (499 not included)."})
    completion_tokens: list[int]
    ttft_p50: list[float | None] = attrs.field(metadata={"doc": "Seconds, over the bucket's streamed answers."})
    ttft_p95: list[float | None]
    queue_depth: list[int] = attrs.field(metadata={"doc": "The most requests seen waiting in the model's queue."})


@attrs.frozen
class LiveTraffic:
    """What this one daemon answered in the window (each daemon and each worker keeps its own)."""

    daemon: str = attrs.field(metadata={"doc": "host:pid of the daemon that counted this."})
    started: int = attrs.field(metadata={"doc": "When it started counting (epoch seconds)."})
    now: int
    start: int = attrs.field(metadata={"doc": "Where the series' first bucket starts (epoch seconds)."})
    bucket_seconds: int
    window_seconds: int
    models: list[LiveSeries]
    replicas: list[LiveSeries]


def _quantiles(bins: list[int] | None) -> tuple[float | None, float | None]:
    """p50 and p95, linear within the bin as Prometheus' histogram_quantile; None over no samples."""
    total = sum(bins) if bins else 0
    if not bins or not total:
        return None, None
    found: list[float] = []
    seen = 0
    wanted = [0.5 * total, 0.95 * total]
    for i, count in enumerate(bins):
        while count and wanted and seen + count >= wanted[0]:
            low = TTFT_BOUNDS[i - 1] if i else 0.0
            high = TTFT_BOUNDS[i] if i < len(TTFT_BOUNDS) else TTFT_BOUNDS[-1]
            found.append(round(low + (high - low) * (wanted.pop(0) - seen) / count, 4))
        if not wanted:
            break
        seen += count
    return found[0], found[1]


def _merged(buckets: list[_Bucket]) -> list[int]:
    bins = [0] * (len(TTFT_BOUNDS) + 1)
    for bucket in buckets:
        if bucket.ttft is not None:
            for i, count in enumerate(bucket.ttft):
                bins[i] += count
    return bins


class LiveWindow:
    def __init__(
        self, daemon: str | None = None, *, max_series: int = MAX_SERIES, queues: WaitingRequests | None = None
    ) -> None:
        self.daemon = daemon or f"{socket.gethostname()}:{os.getpid()}"
        self.started = int(time.time())
        self.max_series = max_series
        self.models: dict[str, _Series] = {}
        self.replicas: dict[str, _Series] = {}
        # The activator's waiting requests per profile key (the ``WaitingRequests`` it counts), read as
        # requests are noted and as the window is read.
        self.queues = queues if queues is not None else WaitingRequests()

    def note(
        self, model: str, replica: str, status: int, ttft: float | None, tokens: int, now: float | None = None
    ) -> None:
        """One answered request (the data path: keep it to a few updates)."""
        tick = int(time.time() if now is None else now) // BUCKET_SECONDS
        bucket = self._series(self.models, model, model, tick).bucket(tick)
        self._count(bucket, status, ttft, tokens)
        depth = self.queues.waiting(model)
        if depth > bucket.queue:
            bucket.queue = depth
        if replica:
            self._count(self._series(self.replicas, replica, model, tick).bucket(tick), status, ttft, tokens)

    @staticmethod
    def _count(bucket: _Bucket, status: int, ttft: float | None, tokens: int) -> None:
        bucket.requests += 1
        if status >= 500:
            bucket.errors += 1
        if tokens > 0:
            bucket.tokens += tokens
        if ttft is not None:
            if bucket.ttft is None:
                bucket.ttft = [0] * (len(TTFT_BOUNDS) + 1)
            bucket.ttft[bisect_left(TTFT_BOUNDS, ttft)] += 1

    def _series(self, table: dict[str, _Series], name: str, model: str, tick: int) -> _Series:
        series = table.get(name)
        if series is None:
            if len(self.models) + len(self.replicas) >= self.max_series:
                self._evict()
            series = table[name] = _Series(model, tick)
        return series

    def _evict(self) -> None:
        """Drop the series used least recently (rare: only when a new one arrives at the cap)."""
        oldest: tuple[int, dict[str, _Series], str] | None = None
        for table in (self.models, self.replicas):
            for name, series in table.items():
                if oldest is None or series.last < oldest[0]:
                    oldest = (series.last, table, name)
        if oldest is not None:
            del oldest[1][oldest[2]]

    def series_count(self) -> int:
        return len(self.models) + len(self.replicas)

    def read(self, model: str | None = None, now: float | None = None) -> LiveTraffic:
        """The window as it stands; ``model``: that model and its replicas only."""
        moment = time.time() if now is None else now
        tick = int(moment) // BUCKET_SECONDS
        for profile_key, depth in self.queues.snapshot().items():
            if depth > 0 and (model is None or profile_key == model):
                bucket = self._series(self.models, profile_key, profile_key, tick).bucket(tick)
                bucket.queue = max(bucket.queue, depth)
        first = tick - BUCKETS + 1
        views: list[list[LiveSeries]] = []
        for table in (self.models, self.replicas):
            for name in [n for n, s in table.items() if s.last < first]:
                del table[name]  # idle for the whole window
            views.append(
                [
                    self._view(name, series, first, tick)
                    for name, series in sorted(table.items())
                    if model is None or series.model == model
                ]
            )
        return LiveTraffic(
            self.daemon, self.started, int(moment), first * BUCKET_SECONDS, BUCKET_SECONDS, WINDOW_SECONDS, *views
        )

    def _view(self, name: str, series: _Series, first: int, tick: int) -> LiveSeries:
        slots: list[_Bucket | None] = [None] * BUCKETS
        for b in series.ring:
            if b is not None and b.tick >= first:
                slots[b.tick - first] = b
        requests = [b.requests if b else 0 for b in slots]
        p50: list[float | None] = []
        p95: list[float | None] = []
        for b in slots:
            median, high = _quantiles(b.ttft if b is not None else None)
            p50.append(median)
            p95.append(high)
        recent = [b for b in slots[-RECENT_BUCKETS:] if b is not None]
        span = RECENT_BUCKETS * BUCKET_SECONDS
        median, high = _quantiles(_merged(recent))
        current = slots[-1].queue if slots[-1] is not None else 0
        summary = LiveSummary(
            round(sum(b.requests for b in recent) / span, 3),
            sum(b.errors for b in recent),
            round(sum(b.tokens for b in recent) / span, 2),
            median,
            high,
            current,
        )
        return LiveSeries(
            name,
            series.model,
            summary,
            requests,
            [b.errors if b else 0 for b in slots],
            [b.tokens if b else 0 for b in slots],
            p50,
            p95,
            [b.queue if b else 0 for b in slots],
        )
