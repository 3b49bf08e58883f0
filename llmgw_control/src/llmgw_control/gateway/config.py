"""The gateway's settings: the ``[router]`` section (deadlines, retries, the body limit) and the
static ``[[endpoints]]`` of gateway-only mode. ``config.py`` composes them into the daemon's config."""

from __future__ import annotations

import attrs

from .replicas import DEFAULT_STATIC_REPLICA_SLOTS


@attrs.frozen
class GatewayConfig:
    # Per-phase deadlines. The first byte includes the engine's queueing and prompt processing,
    # so it is generous; the idle gap bounds a stream whose engine stopped producing.
    connect_timeout: float = 5.0
    first_byte_timeout: float = 300.0
    idle_timeout: float = 120.0
    # Attempts per request across replicas, counting the first; only before any byte reached
    # the client.
    max_attempts: int = 3
    # A chat or completions stream whose engine breaks off after bytes reached the client is
    # continued on another replica at most this many times (each try may meet another failing
    # one; two covers a replica dying and the next being unwell, and bounds the extra work one
    # request can cause); 0: never, the stream ends with an error event.
    max_continuations: int = 2
    # Per model (its name, or model:profile): false turns continuation off for it; models not
    # named are continued.
    continue_streams: dict[str, bool] = attrs.Factory(dict)
    # How long a replica that failed is avoided while others can serve.
    cooldown: float = 10.0
    # Hang detection (gateway/hang_watch.py). A replica whose waiting requests got no byte of any
    # answer for hang_suspect_after seconds has its /health asked, with hang_probe_timeout as the
    # deadline; no answer and it is withdrawn as hung, its waiting requests moved. 3 s of silence
    # is long for an engine that streams (a token every few tens of ms) and short against the
    # 10 s within which a hung replica must be out; the silence alone never withdraws one (a long
    # prompt is silent for minutes), the unanswered /health does, and llama-server answers /health
    # from its HTTP threads however busy its slots are. 3 s for /health, which answers in
    # milliseconds, tolerates a loaded host: suspected at 3-3.5 s, withdrawn by 6.5 s.
    hang_suspect_after: float = 3.0
    hang_probe_timeout: float = 3.0
    # How often the watch looks at every replica's progress: half a second puts a hang's detection
    # within half a second of its bound, for a pass over the replicas that costs microseconds.
    hang_check_every: float = 0.5
    # How often a hung replica's /health is asked again; a 200 puts it back in rotation.
    hung_probe_every: float = 1.0
    # The largest request body (413 above): a long chat with images as base64 data URLs reaches a
    # few MiB; 32 MiB is vLLM-sized headroom that still bounds what one request can make us hold.
    max_body_bytes: int = 32 * 1024 * 1024
    # The profile used when a client asks for a model without one, for every model that has it
    # (e.g. "gpu"); otherwise each model's own default_profile.
    default_profile: str = ""
    # How a model's replica is chosen when its profile does not say (gateway/affinity.py):
    # "prefix" keeps a conversation (or an x-session-id / user) on the replica whose KV cache
    # holds its prefix, within a load bound; "least-loaded" ignores the prefix. prefix by default:
    # bench/affinity.py measured a 2.16x lower median TTFT on multi-turn chat at two replicas (2.14x
    # in a second run; the target was 2x) and 8% more throughput, and the same throughput on
    # prompts that never repeat, which it places exactly as least-loaded does (docs/performance.md,
    # "Cache-aware routing").
    routing: str = "prefix"
    # ε of the load bound: a replica keeps its affinity ids while it holds at most (1 + ε) times the mean
    # load plus one. 0.25: no replica takes more than a quarter above its share under a burst,
    # while the slack keeps ids home through ordinary imbalance (a smaller ε moves more ids on
    # every fluctuation: the paper bounds the moves per change by O(1/ε²)).
    affinity_load_factor: float = 0.25
    # Browser origins whose pages may call the client API (CORS, gateway/cors.py), e.g.
    # "https://chat.example.com", or "*" for any; empty: none (no CORS headers, preflights refused).
    allowed_origins: list[str] = attrs.Factory(list)


@attrs.frozen
class StaticReplicaConfig:
    """A static engine replica, for gateway-only mode."""

    id: str
    url: str
    models: list[str]
    weight: float = 1.0
    # Sent to the engine as a bearer token (llama-server --api-key); never the client's key.
    api_key: str = attrs.field(default="", repr=False)
    # Requests sent to it at once; more wait in the gateway's queue. Set it to llama-server's -np
    # so the queue (and its priorities) is the gateway's; the default only stops a runaway
    # (vLLM's default max_num_seqs).
    slots: int = DEFAULT_STATIC_REPLICA_SLOTS
    # llama-server's -np when it is one: prefix routing then names each conversation's slot
    # (gateway/engine_slots.py), without which b11312 reuses only a shared prefix. 0: the engine
    # chooses (any other engine, or llama-server when in doubt).
    engine_slots: int = 0
