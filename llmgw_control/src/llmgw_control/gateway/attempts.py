"""What one upstream attempt came to, as a value, and what the gateway does about each.

``exchange_with`` (gateway/relay.py) returns one of five outcomes rather than raising one of
several exception classes; ``POLICY`` maps an outcome's kind and the attempt's phase (a first
attempt, or a continuation of a stream already under way) to one step and whether the replica
cools down. ``Gateway._attempts`` and ``Gateway._continue`` are loops over this table, so the
whole retry/continue/answer policy is read (and tested, a test per row) here.
"""

from __future__ import annotations

import enum

import attrs

from ..api_errors import ClientApiError


@attrs.frozen
class Answered:
    """The client has its whole answer (or the relay ended the stream itself, cleanly)."""


ANSWERED = Answered()


@attrs.frozen
class Retry:
    """The attempt failed before anything reached the client: another replica may serve it.

    ``reason`` is the metric's and the log's word for it (connect, closed, http_502, body, hung).
    """

    error: ClientApiError
    reason: str


@attrs.frozen
class Broken:
    """The engine broke off a stream after bytes of it reached the client (it died, it went
    silent for the idle timeout, it was found hung)."""

    error: ClientApiError
    reason: str


@attrs.frozen
class Refused:
    """The engine refused the request (a 4xx, or 501): the request's own fault, which another
    replica would refuse the same way; never counted against the replica. ``status`` and
    ``body`` are the engine's (the body bounded by the relay)."""

    status: int
    body: bytes


@attrs.frozen
class Stalled:
    """No response head within the first-byte deadline while the engine was not found hung: it
    may still be working on the prompt, and another replica would double the request's cost."""

    error: ClientApiError


Outcome = Answered | Retry | Broken | Refused | Stalled


class Phase(enum.Enum):
    # Nothing of the answer has reached the client yet (the first attempt, or a retry).
    ATTEMPT = "attempt"
    # The client's stream is under way: this attempt continues it (gateway/continuation.py).
    CONTINUATION = "continuation"


class Step(enum.Enum):
    # The client has its answer: stop.
    DONE = "done"
    # Answer the client from the outcome (the refusal, the 504) and stop.
    ANSWER = "answer"
    # Try another replica with the same request: nothing of this attempt reached the client.
    NEXT = "next"
    # Continue the client's stream on another replica, from what it has received (a stream that
    # may not be continued ends with the error as its last event, as one that gave up does).
    CONTINUE = "continue"
    # End the client's stream with the outcome's error as its last event.
    END_STREAM = "end_stream"


@attrs.frozen
class Policy:
    step: Step
    # The replica is avoided for router.cooldown while others can serve.
    cool_down: bool


POLICY: dict[tuple[type[Outcome], Phase], Policy] = {
    (Answered, Phase.ATTEMPT): Policy(Step.DONE, cool_down=False),
    (Answered, Phase.CONTINUATION): Policy(Step.DONE, cool_down=False),
    # The engine failed (connect, closed, 5xx, a stalled body, hung) before the client saw a byte.
    (Retry, Phase.ATTEMPT): Policy(Step.NEXT, cool_down=True),
    # The same for a continuation: the next try starts from the same place in the stream.
    (Retry, Phase.CONTINUATION): Policy(Step.NEXT, cool_down=True),
    (Broken, Phase.ATTEMPT): Policy(Step.CONTINUE, cool_down=True),
    # The continuing engine broke off too: continued again, within router.max_continuations.
    (Broken, Phase.CONTINUATION): Policy(Step.CONTINUE, cool_down=True),
    # Another replica would refuse the same request: the client gets the engine's answer.
    (Refused, Phase.ATTEMPT): Policy(Step.ANSWER, cool_down=False),
    # The engine would not continue the stream: no other replica is asked either.
    (Refused, Phase.CONTINUATION): Policy(Step.END_STREAM, cool_down=False),
    # Not retried: that engine may still be working on the prompt (a slow one is never taken for
    # a hung one, gateway/hang_watch.py), and another would double its cost.
    (Stalled, Phase.ATTEMPT): Policy(Step.ANSWER, cool_down=False),
    (Stalled, Phase.CONTINUATION): Policy(Step.END_STREAM, cool_down=False),
}


def policy(outcome: Outcome, phase: Phase) -> Policy:
    return POLICY[type(outcome), phase]
