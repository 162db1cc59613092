"""The deployment state machine, as data.

A deployment moves through the phases of a switch. Each step either succeeds (``ok``) or fails
(``fail``); the table says where that leads. ``advance`` is the only way to move, and an illegal
move raises an error that names the event and the state (after h11's ``_state.py``).

Failures before ``stopping`` abort with the old model still serving. Failures from ``stopping``
on roll back to the previous stable revision, unless the deployment has no fallback (none to go
back to, or rollback disabled): that is a field of its record, fixed when it is planned, and the
table is keyed by it, so nothing outside the table decides where a failure leads.

A warm switch (the target's engine is asleep) is the same table: staging reports ``warm`` and the
deployment goes through ``sleeping`` (the displaced engines sleep), ``verifying`` (the target's GPUs
have the memory its wake takes), ``waking`` (wake and one real completion) to ``routing``. A
wake that errs or does not answer in time reports ``wedged``: ``restarting`` brings the engine back
cold, then the usual ``checking``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise

from orchestrator.errors import StateError


class Phase(StrEnum):
    PLANNED = "planned"
    PREFLIGHT = "preflight"
    STAGING = "staging"
    STOPPING = "stopping"
    FREEING = "freeing"
    INSTALLING = "installing"
    STARTING = "starting"
    CHECKING = "checking"
    ROUTING = "routing"
    SLEEPING = "sleeping"
    VERIFYING = "verifying"
    WAKING = "waking"
    RESTARTING = "restarting"
    ACTIVE = "active"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"
    FAILED = "failed"


class Event(StrEnum):
    OK = "ok"
    FAIL = "fail"
    WARM = "warm"  # staging found the target asleep, its unit unchanged: wake it instead of starting it
    WEDGED = "wedged"  # the woken engine erred or did not answer within wake_deadline_s


class Fallback(StrEnum):
    """What a deployment goes back to when a step fails from ``stopping`` on."""

    PREVIOUS = "previous"  # the previous stable revision, or (front proxy) the serving set before
    NONE = "none"  # nothing: a first deployment, or rollback disabled


P, E, F = Phase, Event, Fallback


def fallback_of(*, previous_revision: int | None, in_set: bool, no_rollback: bool) -> Fallback:
    """The fallback of a deployment being planned. With the front proxy there is always a set to go
    back to (perhaps without this model at all)."""
    if no_rollback or (previous_revision is None and not in_set):
        return F.NONE
    return F.PREVIOUS


@dataclass(frozen=True)
class PhaseText:
    """How a phase reads to people: a progress line, a history column, a colour."""

    label: str
    short: str
    style: str = "bold"


# The one place phases are named for people (progress lines, history, status).
TEXT: dict[Phase, PhaseText] = {
    P.PLANNED: PhaseText("planned", "plan"),
    P.PREFLIGHT: PhaseText("preflight: catalog, host and layout checks", "pre"),
    P.STAGING: PhaseText("staging weights (the old model still serves)", "stage"),
    P.STOPPING: PhaseText("stopping the old unit", "stop"),
    P.FREEING: PhaseText("waiting until the GPUs are really free", "free"),
    P.INSTALLING: PhaseText("installing the unit", "inst"),
    P.STARTING: PhaseText("starting", "start"),
    P.CHECKING: PhaseText("health check: /health, /v1/models, one completion", "check"),
    P.ROUTING: PhaseText("routing: the front proxy moves the route, drains and stops the old engine", "route"),
    P.SLEEPING: PhaseText("sleeping: the route moves, the displaced engines finish their requests and sleep",
                          "sleep"),
    P.VERIFYING: PhaseText("verifying: the target's GPUs have the memory its wake takes (nvidia-smi, by PID)",
                           "verify"),
    P.WAKING: PhaseText("waking: wake_up, then one real completion within wake_deadline_s", "wake"),
    P.RESTARTING: PhaseText("restarting the wedged engine cold (its name answers 503): kill its cgroup, free "
                            "the GPUs, start", "restart", "yellow"),
    P.ACTIVE: PhaseText("active", "active", "green"),
    P.ROLLING_BACK: PhaseText("rolling back to the previous stable revision", "rollback", "yellow"),
    P.ROLLED_BACK: PhaseText("rolled back", "rolled_back", "yellow"),
    P.ABORTED: PhaseText("aborted before anything was stopped", "aborted", "red"),
    P.FAILED: PhaseText("failed", "failed", "red"),
}


def text_of(phase: str) -> PhaseText:
    """The text of a phase given by name (records and progress events carry names)."""
    try:
        return TEXT[Phase(phase)]
    except ValueError:
        return PhaseText(phase, phase, "")

def phase_label(phase: str, *, proxy: bool = True, handover: bool = False, beside: bool = False) -> str | None:
    """The progress line of a phase as this switch runs it; None: the phase does nothing here.

    Without a front proxy there is no route to move (the routing step does nothing). In a handover
    the old engine keeps serving through ``stopping``: it stops in ``routing``, once the route moved.
    Beside (same GPUs, both fit awake) is a handover whose old engine sleeps or stops in ``routing``."""
    if phase == P.ROUTING and not proxy:
        return None
    if beside and phase in _BESIDE:
        return _BESIDE[phase]
    if phase == P.STOPPING and handover:
        return "stopping: nothing yet (a handover: the old engine serves until the route moves)"
    if phase == P.ROUTING and not handover:
        return "routing: the front proxy routes to the new engine"
    return text_of(phase).label


_BESIDE: dict[str, str] = {
    P.STOPPING: "stopping: nothing (beside: the old engine serves until the route moves)",
    P.FREEING: "beside: counting that the target fits next to the serving engine (nvidia-smi, by PID)",
    P.SLEEPING: "sleeping: nothing yet (beside: the target wakes next to the serving engine)",
    P.ROUTING: "routing: the front proxy moves the route; the old engine drains, then sleeps or stops",
}

# The steps that run in order on the way to ACTIVE.
FORWARD: tuple[Phase, ...] = (P.PLANNED, P.PREFLIGHT, P.STAGING, P.STOPPING, P.FREEING,
                              P.INSTALLING, P.STARTING, P.CHECKING, P.ROUTING, P.ACTIVE)
# From here on the old model is (being) stopped: a failure must bring a model back.
DISRUPTIVE: frozenset[Phase] = frozenset({P.STOPPING, P.FREEING, P.INSTALLING, P.STARTING, P.CHECKING,
                                          P.ROUTING})
TERMINAL: frozenset[Phase] = frozenset({P.ACTIVE, P.ROLLED_BACK, P.ABORTED, P.FAILED})
# The warm path: from staging when the target sleeps; a wedged wake restarts it cold, then checks.
WARM: tuple[Phase, ...] = (P.STAGING, P.SLEEPING, P.VERIFYING, P.WAKING, P.ROUTING)
WARM_DISRUPTIVE: frozenset[Phase] = frozenset({P.SLEEPING, P.VERIFYING, P.WAKING, P.RESTARTING})
# Which events other than ok and fail each phase may report.
EXTRA_EVENTS: dict[Phase, Event] = {P.STAGING: E.WARM, P.WAKING: E.WEDGED}


def _table() -> dict[tuple[Phase, Event, Fallback], Phase]:
    table: dict[tuple[Phase, Event, Fallback], Phase] = {}
    for fallback in Fallback:
        for here, there in pairwise(FORWARD):
            table[here, E.OK, fallback] = there
        for phase in (P.PLANNED, P.PREFLIGHT, P.STAGING):
            table[phase, E.FAIL, fallback] = P.ABORTED
        table[P.STAGING, E.WARM, fallback] = P.SLEEPING
        for here, there in pairwise(WARM[1:]):
            table[here, E.OK, fallback] = there
        table[P.WAKING, E.WEDGED, fallback] = P.RESTARTING
        table[P.RESTARTING, E.OK, fallback] = P.CHECKING
        for phase in DISRUPTIVE | WARM_DISRUPTIVE:
            table[phase, E.FAIL, fallback] = P.ROLLING_BACK if fallback is F.PREVIOUS else P.FAILED
        table[P.ROLLING_BACK, E.OK, fallback] = P.ROLLED_BACK
        # A failed rollback is final: both errors are kept and nothing is retried in a loop.
        table[P.ROLLING_BACK, E.FAIL, fallback] = P.FAILED
    return table


TRANSITIONS: dict[tuple[Phase, Event, Fallback], Phase] = _table()


def advance(phase: Phase, event: Event, fallback: Fallback = F.PREVIOUS) -> Phase:
    """The phase after ``event`` happens in ``phase`` to a deployment with ``fallback``."""
    try:
        return TRANSITIONS[phase, event, fallback]
    except KeyError:
        raise StateError(f"event {event.value!r} is not allowed in state {phase.value!r}") from None


def is_terminal(phase: Phase) -> bool:
    return phase in TERMINAL
