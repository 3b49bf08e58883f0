"""The attempt policy table (gateway/attempts.py): a test per row, and every outcome in every phase
has one."""

from __future__ import annotations

import pytest

from llmgw_control.api_errors import ClientApiError
from llmgw_control.gateway.attempts import (
    ANSWERED,
    POLICY,
    Answered,
    Broken,
    Outcome,
    Phase,
    Refused,
    Retry,
    Stalled,
    Step,
    policy,
)

ERROR = ClientApiError(502, "engine trouble", code="upstream_error")
OUTCOMES: dict[type[Outcome], Outcome] = {
    Answered: ANSWERED,
    Retry: Retry(ERROR, "connect"),
    Broken: Broken(ERROR, "upstream_broken"),
    Refused: Refused(400, b'{"error": {"message": "bad request"}}'),
    Stalled: Stalled(ClientApiError(504, "no first byte", code="upstream_timeout")),
}

# (outcome, phase) -> (step, cool_down): the policy as the issue states it.
ROWS = [
    (Answered, Phase.ATTEMPT, Step.DONE, False),
    (Answered, Phase.CONTINUATION, Step.DONE, False),
    # Nothing reached the client: another replica, and the failing one is avoided for a while.
    (Retry, Phase.ATTEMPT, Step.NEXT, True),
    (Retry, Phase.CONTINUATION, Step.NEXT, True),
    # Bytes reached the client: the stream is continued elsewhere, as after an engine death.
    (Broken, Phase.ATTEMPT, Step.CONTINUE, True),
    (Broken, Phase.CONTINUATION, Step.CONTINUE, True),
    # The request's own fault: answered, never counted against the replica.
    (Refused, Phase.ATTEMPT, Step.ANSWER, False),
    (Refused, Phase.CONTINUATION, Step.END_STREAM, False),
    # A first-byte timeout on a live engine is not retried (another replica would double its cost).
    (Stalled, Phase.ATTEMPT, Step.ANSWER, False),
    (Stalled, Phase.CONTINUATION, Step.END_STREAM, False),
]


@pytest.mark.parametrize(
    ("kind", "phase", "step", "cool_down"), ROWS, ids=[f"{kind.__name__}-{phase.value}" for kind, phase, *_ in ROWS]
)
def test_policy_row(kind: type[Outcome], phase: Phase, step: Step, cool_down: bool) -> None:
    rule = policy(OUTCOMES[kind], phase)
    assert rule.step is step
    assert rule.cool_down is cool_down


def test_every_outcome_in_every_phase_has_a_row() -> None:
    assert set(POLICY) == {(kind, phase) for kind in OUTCOMES for phase in Phase}
    assert len(ROWS) == len(POLICY)


def test_only_an_engine_failure_cools_its_replica_down() -> None:
    # A refusal or a slow prompt is no fault of the replica's.
    assert {kind for (kind, _), rule in POLICY.items() if rule.cool_down} == {Retry, Broken}
