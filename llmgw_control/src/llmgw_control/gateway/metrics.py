"""Prometheus metrics of the data path.

Label values come only from things the gateway knows (configured models, replica ids, status
codes), never from raw client input: a client sending random model names must not be able to
create unbounded series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from .demand import WaitingRequests
from .live import LiveWindow

# The *_created series double the exposition size and no dashboard or alert of ours reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# From 5 ms (a cached answer) to 300 s (router.first_byte_timeout, the longest a request may
# wait for its head): Prometheus' default buckets stop at 10 s, below most generations.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# llmgw's own time per request is a millisecond or two (docs/performance.md): fine buckets there.
_OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, demand: WaitingRequests | None = None) -> None:
        self.registry = registry
        # Not Prometheus: the dashboard's last 15 minutes, fed by ``record``, queues by ``demand`` (gateway/live.py).
        self.live = LiveWindow(queues=demand)
        # Declared in this order, which is the order /metrics lists them in.
        self._declare_traffic(registry)
        self._declare_routing(registry)
        self._declare_replica_health(registry)

    def _declare_traffic(self, registry: CollectorRegistry) -> None:
        """What was answered, how fast, and the tokens it carried."""
        self.requests = Counter(
            "llmgw_requests_total",
            "Requests answered, by model, replica and HTTP status (499: client gone).",
            ["model", "replica", "status"],
            registry=registry,
        )
        # By the route's API apart from the series above, whose labels dashboards already read.
        self.api_requests = Counter(
            "llmgw_api_requests_total",
            "Requests answered on the model routes, by API (the route's kind: chat, "
            "completions, embeddings, responses, messages, count_tokens, rerank, tokenize, detokenize, "
            "apply_template, infill) and HTTP status.",
            ["api", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "llmgw_request_duration_seconds",
            "Time from request to last byte sent to the client.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "llmgw_time_to_first_token_seconds",
            "Time from request to the first streamed chunk sent.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            "llmgw_overhead_seconds",
            "Time spent in llmgw itself, excluding waiting on the engine.",
            buckets=_OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "llmgw_requests_in_flight",
            "Requests being served, by model.",
            ["model"],
            registry=registry,
        )
        self.replica_in_flight = Gauge(
            "llmgw_replica_requests_in_flight",
            "Requests in flight per replica.",
            ["replica"],
            registry=registry,
        )
        self.tokens = Counter(
            "llmgw_tokens_total",
            "Tokens reported by engines in usage, by model and kind (prompt, completion).",
            ["model", "kind"],
            registry=registry,
        )
        self.cached_prompt_tokens = Counter(
            "llmgw_cached_prompt_tokens_total",
            "Prompt tokens the engine served from its KV cache (usage.prompt_tokens_details.cached_tokens), "
            'by model; a part of llmgw_tokens_total{kind="prompt"}.',
            ["model"],
            registry=registry,
        )

    def _declare_routing(self, registry: CollectorRegistry) -> None:
        """How requests found a replica: affinity, retries and re-sends, the queue, continued streams."""
        self.affinity = Counter(
            "llmgw_affinity_requests_total",
            "Requests routed by prefix affinity, by model and outcome: hit (the replica the affinity id's conversation "
            "was last placed on, its rendezvous choice, or for a new conversation the least loaded) or miss (it "
            "was full, cooling down or over the load bound, so another took it).",
            ["model", "outcome"],
            registry=registry,
        )
        self.affinity_new = Counter(
            "llmgw_affinity_new_conversations_total",
            'Of llmgw_affinity_requests_total{outcome="hit"}, new conversations (first turns identified by '
            "their content, sessions this daemon had not placed): sent to the least loaded replica and "
            "remembered there.",
            ["model"],
            registry=registry,
        )
        self.retries = Counter(
            "llmgw_upstream_retries_total",
            "Attempts moved to another replica.",
            ["replica", "reason"],
            registry=registry,
        )
        self.stale_resends = Counter(
            "llmgw_upstream_stale_resends_total",
            "Requests re-sent once on a fresh connection because the engine had closed the pooled "
            "connection they went out on (the keep-alive race); never a replica failure.",
            registry=registry,
        )
        self.queue_wait = Histogram(
            "llmgw_queue_wait_seconds",
            "Time requests waited for a replica slot (or for a replica to start), by model; only requests that waited.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_refusals = Counter(
            "llmgw_queue_refusals_total",
            "Requests refused by a model's queue: overflow (429, the queue was full), timeout (503, "
            "waited max_wait), standby (503, this daemon stopped leading).",
            ["model", "reason"],
            registry=registry,
        )
        self.continuations = Counter(
            "llmgw_stream_continuations_total",
            "Streams whose engine broke off after bytes reached the client, by model and outcome: continued "
            "(another replica finished it), finished (the answer was whole but for its [DONE] or finish chunk), "
            "gave_up (router.max_continuations tries, or no other replica), refused (the continuing engine "
            "answered a 4xx), impossible (nothing to carry over: tool calls or reasoning, a stream too long to "
            "record).",
            ["model", "outcome"],
            registry=registry,
        )

    def _declare_replica_health(self, registry: CollectorRegistry) -> None:
        """Replicas found failing, hung or reporting impossible usage."""
        self.cooldowns = Counter(
            "llmgw_replica_cooldowns_total",
            "Times a replica was put in cooldown after a failure.",
            ["replica"],
            registry=registry,
        )
        self.hangs = Counter(
            "llmgw_replica_hangs_total",
            "Times a replica was found hung: requests waited router.hang_suspect_after without a byte from "
            "its engine and its /health did not answer within router.hang_probe_timeout; withdrawn from "
            "routing until its /health answers 200 (gateway/hang_watch.py).",
            ["replica"],
            registry=registry,
        )
        self.hung_replicas = Gauge(
            "llmgw_replicas_hung",
            "Replicas withdrawn from routing as hung now.",
            registry=registry,
        )
        self.usage_clamped = Counter(
            "llmgw_usage_clamped_total",
            "Token counts an engine reported outside what the request could have produced (negative, past "
            "max_tokens or the prompt's size, past 2**24), clamped before quotas and the store saw them; by "
            "replica and field (prompt_tokens, completion_tokens).",
            ["replica", "field"],
            registry=registry,
        )

    def forget_replica(self, replica_id: str) -> None:
        """Drop every series labelled with ``replica_id``: the replica is gone for good, and a
        fleet that starts and stops replicas all day must not grow /metrics with each one."""
        for metric in (
            self.requests,
            self.replica_in_flight,
            self.retries,
            self.cooldowns,
            self.hangs,
            self.usage_clamped,
        ):
            metric.remove_by_labels({"replica": replica_id})
