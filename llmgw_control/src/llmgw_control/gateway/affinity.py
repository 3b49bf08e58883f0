"""Cache-aware routing: which replica a request *prefers*, and when it may have it.

llama-server keeps each slot's KV cache (and a RAM cache of recent prompts) and reuses the
longest common prefix of the next prompt. (Measured on b11312: a replica serving several
conversations interleaved, left to choose slots itself, reuses only their shared prefix; so on
llama-server the request also names its conversation's slot, gateway/engine_slots.py.)
Least-loaded routing scatters a
conversation's turns over the replicas, so each turn's history is computed again wherever it
lands. Here a request gets an *affinity id* and the id a stable preference order over the
model's replicas (rendezvous, or highest-random-weight, hashing); the request takes the first
replica in that order whose load stays within the bound of consistent hashing with bounded loads
(Mirrokni, Thorup, Zadimoghaddam 2018): ``load + 1 <= (1 + ε) · mean load + 1`` with the request
counted. A replica that joins takes only the ids it now ranks first for; one that leaves gives
up only its own.

**The affinity id.** An explicit session wins: the ``x-session-id`` header, else the OpenAI ``user``
field. Otherwise, for chat, the conversation's *opening*: the messages up to and including the
first user message (the system prompt and the first question). The issue suggested the messages
before the *last* user turn; that prefix changes with every turn (turn two's is turn one's plus
an exchange), so its hash would send each turn of a conversation to a new replica -- exactly the
scattering this is meant to end. The opening is the same for every turn of a conversation,
differs between conversations that share a system prompt (so they spread over the replicas,
each of which soon holds the shared system prompt anyway), and is where the engine's cached
prefix starts. For completions it is the prompt's first ``COMPLETION_PREFIX_CHARS`` characters.
Embeddings have no cache worth keeping: no affinity id, least-loaded.

**New conversations.** A request that carries no earlier turns (a chat request with nothing
after its first user message, or a completions prompt) and is identified by its content, or an
explicit session this daemon has not placed, has nothing cached anywhere but what every replica
shares: it goes to the least loaded replica, and gateway/placements.py remembers where. A later
turn (or a placed session) goes back there first. A request with earlier turns whose id this
daemon has not placed (another daemon served them, or this one restarted) takes its rendezvous
order, which every daemon agrees on. Each choice is bounded by load the same way.

Everything here reads hostile input: odd types give no affinity id (least-loaded), never an error, and
what is hashed is bounded per message and in the number of messages.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Collection, Sequence
from typing import Any, Literal

import attrs

from ..catalog import ROUTING_POLICIES
from .balancer import C, choose
from .requests import ParsedRequest

__all__ = [
    "ROUTING_POLICIES",
    "Affinity",
    "Outcome",
    "affinity_id",
    "choose_affine",
    "continues_conversation",
    "pick",
    "preference",
    "request_affinity",
]

# A session id or `user` beyond this is truncated before hashing: OpenAI documents `user` as a
# short end-user id, and 256 characters distinguish any real session while bounding the work.
SESSION_ID_CHARS = 256
# Characters of each opening message that go into the id: enough to tell conversations apart
# (two openings that agree on their first 4 KiB per message are, for routing, the same), and a
# bound on the work a 32 MiB message could cause (hashing 4 KiB is ~5 µs).
MESSAGE_ID_CHARS = 4096
# Messages before the first user message that count (system, developer, few-shot examples): a
# conversation with more is identified by its first 16, and a hostile list of a million system
# messages costs no more than 16.
OPENING_MESSAGES = 16
# Content parts of one message that count, for the same reason.
CONTENT_PARTS = 16
# A completions prompt's first 4096 characters (~1k tokens) identify its conversation: a prompt
# that grows by appending keeps them, and prompts sharing a longer preamble get one id (and the
# load bound spreads them).
COMPLETION_PREFIX_CHARS = 4096
# Token ids of a pre-tokenized prompt that count, the same ~1k tokens.
COMPLETION_PREFIX_TOKENS = 1024


@attrs.frozen
class Affinity:
    """A request's preference: its affinity id, the load factor ε of the bound, whether it carries
    earlier turns of its conversation (``continues_conversation``), and whether its id is an
    explicit session (``x-session-id`` or ``user``) rather than its content.

    ``continues`` defaults to True, the cautious reading: an unseen id then takes its rendezvous
    order, where another daemon would have sent its earlier turns.
    """

    id: bytes
    load_factor: float
    continues: bool = True
    session: bool = False


# How a request with affinity was placed: on the replica its id prefers ("hit"), on another
# because that one was full, cooling down or over the load bound ("miss"), or, a new conversation
# (a first turn identified by its content, a session this daemon had not placed), on the least loaded
# replica ("new").
Outcome = Literal["hit", "miss", "new"]


def session_affinity_id(header: str | None, payload: dict[str, Any]) -> bytes | None:
    """The explicit session's affinity id: the ``x-session-id`` header, else the ``user`` field."""
    if header is not None and header.strip():
        return _digest(b"s", header.strip()[:SESSION_ID_CHARS])
    user = payload.get("user")
    if isinstance(user, str) and user.strip():
        return _digest(b"u", user.strip()[:SESSION_ID_CHARS])
    return None


def request_affinity(request: ParsedRequest, session_header: str | None, load_factor: float) -> Affinity | None:
    """The request's ``Affinity`` under prefix routing, or None when it has no affinity id (least-loaded).

    None for the routes that hold no conversation (embeddings, rerank, the tokenizer routes):
    there is no KV cache to go back to, and pinning them would only claim an engine slot.
    """
    if request.endpoint.affinity == "none":
        return None
    explicit = session_affinity_id(session_header, request.payload)
    affinity_id = explicit if explicit is not None else _content_id(request)
    if affinity_id is None:
        return None
    return Affinity(affinity_id, load_factor, continues_conversation(request), session=explicit is not None)


def affinity_id(request: ParsedRequest, session_header: str | None = None) -> bytes | None:
    """The request's affinity id (16 bytes), or None when it has none (least-loaded then)."""
    explicit = session_affinity_id(session_header, request.payload)
    if explicit is not None:
        return explicit
    return _content_id(request)


def _content_id(request: ParsedRequest) -> bytes | None:
    shape = request.endpoint.affinity
    if shape == "messages":
        return _opening_id(_conversation(request))
    if shape == "prompt":
        payload = request.payload
        return _prompt_id(payload.get("prompt") if "prompt" in payload else payload.get("input_prefix"))
    return None


def _conversation(request: ParsedRequest) -> Any:
    """The request's messages in chat's shape: Anthropic's ``system`` and the Responses API's
    ``instructions`` as a first system message, a Responses ``input`` string as one user message."""
    payload = request.payload
    messages = payload.get(request.endpoint.messages)
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    system = payload.get("system", payload.get("instructions"))
    if system is not None and request.endpoint.kind != "chat" and isinstance(messages, list):
        messages = [{"role": "system", "content": system}, *messages[:OPENING_MESSAGES]]
    return messages


def continues_conversation(request: ParsedRequest) -> bool:
    """Whether the request carries earlier turns of its conversation, which a replica may hold.

    Chat (and Messages, Responses): a message after the first user message (an answer, a tool
    result, the next question). Completions carry no turns: a prompt is its own opening. Bounded
    like the id: at most ``OPENING_MESSAGES`` messages are looked at.
    """
    if request.endpoint.affinity != "messages":
        return False
    messages = _conversation(request)
    if not isinstance(messages, list):
        return False
    for index, message in enumerate(messages[: OPENING_MESSAGES + 1]):
        if isinstance(message, dict) and message.get("role") == "user":
            return index + 1 < len(messages)
    return False


def _opening_id(messages: Any) -> bytes | None:
    if not isinstance(messages, list) or not messages:
        return None
    hasher = hashlib.blake2b(b"c", digest_size=16)
    for message in messages[: OPENING_MESSAGES + 1]:
        if not isinstance(message, dict):
            return None
        role = message.get("role")
        role = role[:32] if isinstance(role, str) else ""
        text = _content_text(message.get("content"))
        # Lengths first, so no two different openings encode to the same bytes.
        for part in (role, text):
            encoded = part.encode("utf-8", "surrogatepass")
            hasher.update(len(encoded).to_bytes(4, "big"))
            hasher.update(encoded)
        if role == "user":
            break
    return hasher.digest()


def _content_text(content: Any) -> str:
    """A message's text, bounded: a string, or the text of its parts (images by their URL's head)."""
    if isinstance(content, str):
        return content[:MESSAGE_ID_CHARS]
    if not isinstance(content, list):
        return ""
    pieces: list[str] = []
    budget = MESSAGE_ID_CHARS
    for part in content[:CONTENT_PARTS]:
        if budget <= 0:
            break
        if not isinstance(part, dict):
            continue
        text = part.get("text")
        if not isinstance(text, str):
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            text = url[:256] if isinstance(url, str) else ""
        pieces.append(text[:budget])
        budget -= len(pieces[-1])
    return "\x1f".join(pieces)


def _prompt_id(prompt: Any) -> bytes | None:
    if isinstance(prompt, list):
        if not prompt:
            return None
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt[:COMPLETION_PREFIX_TOKENS]):
            tokens = ",".join(str(t) for t in prompt[:COMPLETION_PREFIX_TOKENS])
            return _digest(b"t", tokens)
        # A batch of prompts: they go to one replica together, identified by the first.
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return _digest(b"p", prompt[:COMPLETION_PREFIX_CHARS])
    return None


def _digest(kind: bytes, text: str) -> bytes:
    return hashlib.blake2b(kind + text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


# ---------------------------------------------------------------------- the choice

_TWO_TO_64 = float(1 << 64)


def rendezvous_score(affinity_id: bytes, replica_id: str, weight: float) -> float:
    """The replica's weighted rendezvous score for ``affinity_id``; the highest is preferred.

    ``-weight / ln(u)`` with ``u`` uniform in (0, 1) from the hash: a replica of twice the
    weight is preferred by twice the ids (Schindelhauer & Schomaker's weighted HRW), and the
    score of a pair never depends on the other replicas, which is why membership changes move
    only the ids of the replica that came or went.
    """
    value = int.from_bytes(hashlib.blake2b(replica_id.encode(), digest_size=8, key=affinity_id).digest(), "big")
    u = (value + 0.5) / _TWO_TO_64
    return -max(weight, 1e-9) / math.log(u)


def preference(candidates: Sequence[C], affinity_id: bytes) -> list[C]:
    """The replicas in ``affinity_id``'s order of preference (ties, practically never, by id)."""
    return sorted(candidates, key=lambda c: (-rendezvous_score(affinity_id, c.id, c.weight), c.id))


def load_bound(replica: C, candidates: Sequence[C], load_factor: float) -> float:
    """The most requests ``replica`` may hold after taking this one: ``(1 + ε) · mean + 1``.

    The mean is over the candidates' requests *with this one counted* and is shared out by weight
    (for equal weights, exactly ``(1 + ε) · (Σ in_flight + 1) / n + 1``). The ``+ 1`` lets an idle
    fleet keep an affinity id on its preferred replica instead of spreading a lone request by load.
    """
    total_weight = sum(max(c.weight, 1e-9) for c in candidates)
    total = sum(c.in_flight for c in candidates) + 1
    return (1 + load_factor) * total * max(replica.weight, 1e-9) / total_weight + 1


def choose_affine(
    candidates: Sequence[C],
    affinity: Affinity,
    *,
    now: float,
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
    first: str | None = None,
) -> tuple[C | None, bool]:
    """The replica for a request with ``affinity``, and whether it is the head of its order.

    The order is the affinity id's rendezvous preference over the replicas not excluded, with ``first``
    (the replica this daemon last placed the id on) moved to its head when it is one of them.
    Walk it; take the first replica that is not cooling down, has a free slot and stays within
    its load bound. When none does, the least-loaded rule (``balancer.choose``) decides, so
    affinity never makes a request wait while another replica has room.
    """
    usable = [c for c in candidates if not (exclude and c.id in exclude)]
    if not usable:
        return None, False
    ordered = preference(usable, affinity.id)
    if first is not None:
        for index, c in enumerate(ordered):
            if c.id == first:
                ordered.insert(0, ordered.pop(index))
                break
    for c in ordered:
        if c.in_flight >= c.slots or c.cooldown_until > now:
            continue
        if c.in_flight + 1 <= load_bound(c, usable, affinity.load_factor):
            return c, c is ordered[0]
    fallback = choose(usable, now=now, rng=rng)
    return fallback, fallback is not None and fallback is ordered[0]


def pick(
    candidates: Sequence[C],
    affinity: Affinity | None,
    *,
    now: float,
    exclude: Collection[str] = (),
    placed: str | None = None,
) -> tuple[C | None, Outcome | None]:
    """The replica for a request, and how affinity placed it (None without affinity).

    ``placed``: the replica this daemon last sent the id to (gateway/placements.py), or None.
    Least-loaded without affinity and for a new conversation: a request identified by its content with
    no earlier turns (whatever ``placed`` says: identical first turns sent at once share nothing
    in flight, and piling them onto one replica within the bound only slows them), or a session
    this daemon has not placed. Otherwise ``choose_affine`` with ``placed`` first.
    """
    if affinity is None:
        return choose(candidates, now=now, exclude=exclude), None
    if placed is not None and (
        not (affinity.continues or affinity.session) or not any(c.id == placed for c in candidates)
    ):
        # A first turn identified by its content starts afresh; a replica that is gone holds nothing.
        placed = None
    if placed is None and not affinity.continues:
        chosen = choose(candidates, now=now, exclude=exclude)
        return chosen, None if chosen is None else "new"
    chosen, head = choose_affine(candidates, affinity, now=now, exclude=exclude, first=placed)
    return chosen, None if chosen is None else ("hit" if head else "miss")
