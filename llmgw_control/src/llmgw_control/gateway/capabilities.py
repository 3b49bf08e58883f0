"""What each model can serve, so that a caller's mistake is answered as the caller's.

A model's capabilities are the routes it serves (``chat``, ``completions``, ``embeddings``,
``responses``, ``messages``, ``rerank``, ``tokenize``, ``infill``) and the features a request may
need (``vision``, ``audio``, ``tools``). They come from three places, the first that says wins:

1. the catalog profile's ``capabilities`` list, the operator's word;
2. otherwise the routes the profile's engine serves as started (llama-server serves embeddings
   only with ``--embeddings``, rerank only with ``--reranking``);
3. the features the replicas' engines report about themselves (llama-server's ``/props``:
   ``modalities``, ``chat_template_caps.supports_tools``, the context ``n_ctx``), learned by
   ``learn`` once per replica, when first needed.

Nothing known (a static replica whose engine has not answered yet): nothing is refused here, and
the engine's own refusal (a 4xx or 501) reaches the client as a 4xx (gateway/relay.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import trio

from llmgw_shared.jsonin import loads as json_loads
from llmgw_shared.logs import get_logger

from ..api_errors import ClientApiError
from ..catalog.models import CAPABILITIES, ProfileConfig
from .engine_facts import EngineFacts, facts_from
from .replicas import Replica
from .requests import ParsedRequest
from .upstream import UpstreamClient, UpstreamError

log = get_logger(__name__)

ROUTES = CAPABILITIES[:8]
FEATURES = CAPABILITIES[8:]
# What llama-server serves on any model, without flags (infill needs the model's FIM tokens; a
# model without them answers 501, which the client gets as a 400).
_LLAMA_ROUTES = frozenset({"chat", "completions", "responses", "messages", "tokenize", "infill"})
# Flags that turn on a route (llama-server b11312's spellings).
_LLAMA_FLAGS = {
    "--embeddings": "embeddings",
    "--embedding": "embeddings",
    "--reranking": "rerank",
    "--rerank": "rerank",
}

# How long an engine has to answer /props and /v1/models: llama-server answers them from memory
# in milliseconds, busy or not, and the caller waits (once per replica per PROBE_RETRY).
PROBE_TIMEOUT = 2.0
# Engines asked at once, by the whole process: probing is not the data path.
PROBE_CONCURRENCY = 4
# Seconds before an engine that did not answer is asked again.
PROBE_RETRY = 30.0
# The most of an engine's answer read: /props holds the chat template (tens of KiB).
PROBE_BODY_LIMIT = 1024 * 1024


@attrs.frozen
class ModelCapabilities:
    serves: frozenset[str]
    context_length: int | None = None
    created: int | None = None

    def listed(self) -> list[str]:
        return [name for name in CAPABILITIES if name in self.serves]


def declared(profile: ProfileConfig | None) -> frozenset[str] | None:
    """The routes a profile serves before any engine is asked: its own list, else what its engine
    serves as started; None when not known (an engine other than llama.cpp, a static replica)."""
    if profile is None:
        return None
    if profile.capabilities:
        return frozenset(profile.capabilities)
    if profile.engine != "llama.cpp":
        return None
    return _LLAMA_ROUTES | {_LLAMA_FLAGS[arg] for arg in profile.args if arg in _LLAMA_FLAGS}


def combine(
    explicit: bool, routes: frozenset[str] | None, facts: Iterable[EngineFacts], context: int | None = None
) -> ModelCapabilities | None:
    """A model's capabilities: an explicit list as it is; else its routes and its replicas' facts.

    A feature is known served when any replica reports it, unserved when every replica that
    reported says no; a model whose features no replica reported is refused none of them.
    """
    known = list(facts)
    if explicit and routes is not None:
        return ModelCapabilities(routes, _least_context(known) or context, _created(known))
    if routes is None and not known:
        return None
    serves = set(routes if routes is not None else ROUTES)
    for feature in FEATURES:
        said = [getattr(f, feature) for f in known if getattr(f, feature) is not None]
        if not said or any(said):
            serves.add(feature)
    return ModelCapabilities(frozenset(serves), _least_context(known) or context, _created(known))


def _least_context(facts: list[EngineFacts]) -> int | None:
    # A request must fit whichever replica serves it.
    contexts = [f.context_length for f in facts if f.context_length]
    return min(contexts) if contexts else None


def _created(facts: list[EngineFacts]) -> int | None:
    stamps = [f.created for f in facts if f.created]
    return min(stamps) if stamps else None


# Parts of a message that carry an image or audio, in the chat, Responses and Messages shapes.
_IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
_AUDIO_PARTS = frozenset({"input_audio", "audio"})
# Messages (and parts of each) looked at for media: a request with more is not scanned further,
# and the engine's own answer decides (bounded work for a hostile body).
_SCAN_MESSAGES = 256
_SCAN_PARTS = 64


def needs(request: ParsedRequest) -> list[str]:
    """The capabilities ``request`` needs: its route's, and vision or audio for media parts."""
    wanted = [request.endpoint.capability]
    field = request.endpoint.messages
    messages = request.payload.get(field) if field else None
    if not isinstance(messages, list):
        return wanted
    kinds: set[str] = set()
    for message in messages[:_SCAN_MESSAGES]:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            kinds.update(str(part.get("type")) for part in content[:_SCAN_PARTS] if isinstance(part, dict))
    if kinds & _IMAGE_PARTS:
        wanted.append("vision")
    if kinds & _AUDIO_PARTS:
        wanted.append("audio")
    return wanted


def refusal(model: str, capabilities: ModelCapabilities | None, wanted: list[str]) -> ClientApiError | None:
    """The 400 for a request that needs ``wanted`` (``needs``) which ``model`` cannot serve, or None."""
    if capabilities is None:
        return None
    missing = [name for name in wanted if name not in capabilities.serves]
    if not missing:
        return None
    what = {"vision": "image input", "audio": "audio input"}.get(missing[0], f"the {missing[0]} API")
    return ClientApiError(
        400,
        f"The model '{model}' does not serve {what} (it serves: {', '.join(capabilities.listed())}).",
        code="unsupported_by_model",
        param="model",
        headers=(("x-should-retry", "false"),),
    )


async def _get_json(upstream: UpstreamClient, replica: Replica, path: str) -> Any:
    headers = [("accept", "application/json")]
    if replica.api_key:
        headers.append(("authorization", f"Bearer {replica.api_key}"))
    async with upstream.open(
        "GET", replica.url + path, headers=headers, body=b"", connect_timeout=PROBE_TIMEOUT
    ) as response:
        if response.status_code != 200:
            return None
        parts: list[bytes] = []
        size = 0
        while (chunk := await response.next_chunk()) is not None:
            parts.append(chunk)
            size += len(chunk)
            if size > PROBE_BODY_LIMIT:
                return None
    try:
        return json_loads(b"".join(parts))
    except ValueError:
        return None


async def probe(upstream: UpstreamClient, replica: Replica) -> EngineFacts | None:
    """Ask one engine what it is; None when it did not answer in time (asked again later)."""
    with trio.move_on_after(PROBE_TIMEOUT):
        try:
            props = await _get_json(upstream, replica, "/props")
            models = await _get_json(upstream, replica, "/v1/models")
        except UpstreamError as exc:
            # Connect, early close, broken body: asked again after PROBE_RETRY.
            log.debug("replica %s did not say what it serves: %s", replica.id, exc)
            return None
        # Any answer at all gives facts (unknown where it says nothing): facts_from reads any JSON.
        return facts_from(props, models)
    return None


async def learn(upstream: UpstreamClient, replicas: Iterable[Replica], limiter: trio.CapacityLimiter) -> None:
    """Ask the engines of ``replicas`` not yet asked what they serve, at once, within PROBE_TIMEOUT.

    On demand, not in the background: only /v1/models and a request that needs a feature (an
    image, audio) wait for it, once per replica; one that did not answer is asked again only
    after PROBE_RETRY, so a dead replica delays no request more than once in that time.
    """
    now = trio.current_time()
    asked = [r for r in replicas if r.facts is None and r.probe_after <= now]
    if not asked:
        return
    for replica in asked:
        replica.probe_after = now + PROBE_RETRY

    async def one(replica: Replica) -> None:
        async with limiter:
            facts = await probe(upstream, replica)
        if facts is not None:
            replica.facts = facts

    # One deadline for all of them: a /v1/models over many replicas, some dead, waits no longer
    # than one probe; those not asked in time are asked after PROBE_RETRY.
    with trio.move_on_after(PROBE_TIMEOUT):
        async with trio.open_nursery() as nursery:
            for replica in asked:
                nursery.start_soon(one, replica)
