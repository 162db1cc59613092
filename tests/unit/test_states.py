"""The state machine as data: every legal move, and the error for an illegal one."""

from __future__ import annotations

import pytest

from orchestrator.core.states import (
    EXTRA_EVENTS,
    FORWARD,
    TERMINAL,
    TRANSITIONS,
    Event,
    Fallback,
    Phase,
    advance,
    fallback_of,
)
from orchestrator.errors import StateError


def test_forward_path_reaches_active() -> None:
    """Succeeding at every step walks planned -> ... -> active."""
    phase = Phase.PLANNED
    seen = [phase]
    while phase is not Phase.ACTIVE:
        phase = advance(phase, Event.OK)
        seen.append(phase)
    assert tuple(seen) == FORWARD


@pytest.mark.parametrize("phase", [Phase.PLANNED, Phase.PREFLIGHT, Phase.STAGING])
def test_failure_before_stopping_aborts(phase: Phase) -> None:
    """Nothing was stopped yet, so a failure aborts and the old model keeps serving."""
    assert advance(phase, Event.FAIL) is Phase.ABORTED


@pytest.mark.parametrize("phase", [Phase.STOPPING, Phase.FREEING, Phase.INSTALLING, Phase.STARTING, Phase.CHECKING])
def test_failure_after_stopping_rolls_back(phase: Phase) -> None:
    """From stopping on, a failure rolls back (or fails when rollback is impossible)."""
    assert advance(phase, Event.FAIL) is Phase.ROLLING_BACK
    assert advance(phase, Event.FAIL, Fallback.NONE) is Phase.FAILED


@pytest.mark.parametrize("phase", [Phase.PLANNED, Phase.PREFLIGHT, Phase.STAGING])
def test_failure_before_stopping_aborts_whatever_the_fallback(phase: Phase) -> None:
    """Without a fallback a failure before anything stopped still aborts (the old model serves)."""
    assert advance(phase, Event.FAIL, Fallback.NONE) is Phase.ABORTED


def test_the_table_decides_every_move_of_every_fallback() -> None:
    """Each running phase has a row for ok and fail under each fallback, and for the one extra event it
    may report (warm from staging, wedged from waking): no move is chosen in code."""
    running = set(Phase) - TERMINAL
    expected = {(p, e, f) for p in running for e in (Event.OK, Event.FAIL) for f in Fallback}
    expected |= {(p, e, f) for p, e in EXTRA_EVENTS.items() for f in Fallback}
    assert set(TRANSITIONS) == expected


def test_warm_path_sleeps_verifies_wakes_then_routes() -> None:
    """A target found asleep goes staging -> sleeping -> verifying -> waking -> routing -> active."""
    phase, seen = advance(Phase.STAGING, Event.WARM), [Phase.STAGING]
    while phase is not Phase.ACTIVE:
        seen.append(phase)
        phase = advance(phase, Event.OK)
    assert seen == [Phase.STAGING, Phase.SLEEPING, Phase.VERIFYING, Phase.WAKING, Phase.ROUTING]


def test_wedged_wake_restarts_cold_then_checks() -> None:
    """A wedged wake leads to restarting, whose success leads to the usual health check."""
    assert advance(Phase.WAKING, Event.WEDGED) is Phase.RESTARTING
    assert advance(Phase.RESTARTING, Event.OK) is Phase.CHECKING


@pytest.mark.parametrize("phase", [Phase.SLEEPING, Phase.VERIFYING, Phase.WAKING, Phase.RESTARTING])
def test_failure_on_the_warm_path_rolls_back(phase: Phase) -> None:
    """Once a displaced engine sleeps, a failure rolls back (or fails without a fallback)."""
    assert advance(phase, Event.FAIL) is Phase.ROLLING_BACK
    assert advance(phase, Event.FAIL, Fallback.NONE) is Phase.FAILED


def test_wedged_is_not_allowed_outside_waking() -> None:
    """Only the wake may report a wedged engine; elsewhere the event is illegal and named."""
    with pytest.raises(StateError, match="event 'wedged' is not allowed in state 'checking'"):
        advance(Phase.CHECKING, Event.WEDGED)


def test_a_deployment_falls_back_only_with_something_to_go_back_to() -> None:
    """A previous revision (or the proxy's set) gives a fallback; --no-rollback or none of them: none."""
    assert fallback_of(previous_revision=3, in_set=False, no_rollback=False) is Fallback.PREVIOUS
    assert fallback_of(previous_revision=None, in_set=True, no_rollback=False) is Fallback.PREVIOUS
    assert fallback_of(previous_revision=None, in_set=False, no_rollback=False) is Fallback.NONE
    assert fallback_of(previous_revision=3, in_set=True, no_rollback=True) is Fallback.NONE


def test_failed_rollback_is_final() -> None:
    """A rollback that fails ends in failed; nothing loops back into rolling_back."""
    assert advance(Phase.ROLLING_BACK, Event.FAIL) is Phase.FAILED
    assert all(dst is not Phase.ROLLING_BACK for (src, _, _), dst in TRANSITIONS.items() if src is Phase.ROLLING_BACK)


@pytest.mark.parametrize("phase", sorted(TERMINAL))
def test_terminal_states_accept_no_event(phase: Phase) -> None:
    """An event in a terminal state is illegal and the error names both."""
    with pytest.raises(StateError, match=f"event 'ok' is not allowed in state '{phase.value}'"):
        advance(phase, Event.OK)


def test_every_phase_that_runs_has_a_step() -> None:
    """The engine's step table covers exactly the phases that are not terminal."""
    from orchestrator.deploy.steps import STEPS

    assert set(STEPS) == set(Phase) - TERMINAL


def test_every_phase_has_text_for_people() -> None:
    """Progress lines and history read each phase's text from one table."""
    from orchestrator.core.states import TEXT

    assert set(TEXT) == set(Phase)
