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

from orchestrator.errors import EngineWedged, OrchestratorError, StateError


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
    ADOPTED = "adopted"  # what already runs, recorded as it is (orchestrator adopt): it serves at once


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
    P.SLEEPING: PhaseText("sleeping: the route moves, the displaced engines finish their requests and sleep", "sleep"),
    P.VERIFYING: PhaseText(
        "verifying: the target's GPUs have the memory its wake takes (nvidia-smi, by PID)", "verify"
    ),
    P.WAKING: PhaseText("waking: wake_up, then one real completion within wake_deadline_s", "wake"),
    P.RESTARTING: PhaseText(
        "restarting the wedged engine cold (its name answers 503): kill its cgroup, free the GPUs, start",
        "restart",
        "yellow",
    ),
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


# -- the table ------------------------------------------------------------------------------------
# Where a failure leads from a phase that has stopped (or put to sleep) what served: back to the
# previous stable revision when the deployment has one to go back to, else failed.
@dataclass(frozen=True)
class ByFallback:
    previous: Phase  # with Fallback.PREVIOUS
    none: Phase  # with Fallback.NONE

    def of(self, fallback: Fallback) -> Phase:
        return self.previous if fallback is F.PREVIOUS else self.none


BACK = ByFallback(previous=P.ROLLING_BACK, none=P.FAILED)

# Every move of a deployment, one row a phase, read top to bottom. Nothing outside this table decides
# where an event leads; a phase with no row has ended.
TABLE: dict[Phase, dict[Event, Phase | ByFallback]] = {
    # the cold path (the old model serves until stopping; a failure before it aborts, nothing stopped)
    P.PLANNED:      {E.OK: P.PREFLIGHT,  E.FAIL: P.ABORTED, E.ADOPTED: P.ACTIVE},
    P.PREFLIGHT:    {E.OK: P.STAGING,    E.FAIL: P.ABORTED},
    P.STAGING:      {E.OK: P.STOPPING,   E.FAIL: P.ABORTED, E.WARM: P.SLEEPING},
    P.STOPPING:     {E.OK: P.FREEING,    E.FAIL: BACK},
    P.FREEING:      {E.OK: P.INSTALLING, E.FAIL: BACK},
    P.INSTALLING:   {E.OK: P.STARTING,   E.FAIL: BACK},
    P.STARTING:     {E.OK: P.CHECKING,   E.FAIL: BACK},
    P.CHECKING:     {E.OK: P.ROUTING,    E.FAIL: BACK},
    P.ROUTING:      {E.OK: P.ACTIVE,     E.FAIL: BACK},
    # the warm path (staging found the target asleep); a wedged wake restarts it cold, then checks
    P.SLEEPING:     {E.OK: P.VERIFYING,  E.FAIL: BACK},
    P.VERIFYING:    {E.OK: P.WAKING,     E.FAIL: BACK},
    P.WAKING:       {E.OK: P.ROUTING,    E.FAIL: BACK, E.WEDGED: P.RESTARTING},
    P.RESTARTING:   {E.OK: P.CHECKING,   E.FAIL: BACK},
    # a failed rollback is final: both errors are kept and nothing is retried in a loop
    P.ROLLING_BACK: {E.OK: P.ROLLED_BACK, E.FAIL: P.FAILED},
}  # fmt: skip

# -- facts about phases -------------------------------------------------------------------------------
# The outcomes: a deployment in one of these has ended (no row in TABLE).
ENDED: frozenset[Phase] = frozenset({P.ACTIVE, P.ROLLED_BACK, P.ABORTED, P.FAILED})
TERMINAL = ENDED  # the older name
# The steps that run in order on the way to ACTIVE (the cold path).
FORWARD: tuple[Phase, ...] = (
    P.PLANNED,
    P.PREFLIGHT,
    P.STAGING,
    P.STOPPING,
    P.FREEING,
    P.INSTALLING,
    P.STARTING,
    P.CHECKING,
    P.ROUTING,
    P.ACTIVE,
)
# The warm path, from staging when the target sleeps.
WARM: tuple[Phase, ...] = (P.STAGING, P.SLEEPING, P.VERIFYING, P.WAKING, P.ROUTING)
# Downtime: the phases in which the old model may no longer serve and the new one may not yet (the
# dashboard counts them; a handover or beside switch keeps serving through some of them).
DOWN: frozenset[Phase] = frozenset(
    {
        P.STOPPING,
        P.FREEING,
        P.INSTALLING,
        P.STARTING,
        P.CHECKING,
        P.ROUTING,
        P.SLEEPING,
        P.VERIFYING,
        P.WAKING,
        P.RESTARTING,
        P.ROLLING_BACK,
    }
)
# The target loads: its start and its health check (tune counts them as the load time).
LOADING: frozenset[Phase] = frozenset({P.STARTING, P.CHECKING})
# A cold start on demand may be abandoned while the target itself loads (never in a rollback's phases).
ABANDONABLE: frozenset[Phase] = frozenset({P.STARTING, P.CHECKING})
# The phases that observe the host and decide while what serves keeps serving: they share one view of
# it, each unit and engine read once (deploy/read_once.py); none of them polls.
DECIDING: frozenset[Phase] = frozenset({P.PREFLIGHT, P.STAGING})
# Which events other than ok and fail each phase may report.
EXTRA_EVENTS: dict[Phase, Event] = {P.PLANNED: E.ADOPTED, P.STAGING: E.WARM, P.WAKING: E.WEDGED}
# A step's error that reports its phase's extra event rather than ``fail``, by phase and error type.
RAISED_EVENTS: dict[Phase, tuple[type[OrchestratorError], Event]] = {P.WAKING: (EngineWedged, E.WEDGED)}


class Serves(StrEnum):
    """What serves once a deployment enters an outcome that moves the serving pointer (and set)."""

    TARGET = "target"  # the deployment's revision, beside what it did not displace
    KEPT = "kept"  # only what it did not displace: nothing is known to serve in its place


# Only these outcomes move the serving pointer: a rollback that succeeds leaves it where it was
# (the previous revision), an abort never moved it.
MOVES_SERVING: dict[Phase, Serves] = {P.ACTIVE: Serves.TARGET, P.FAILED: Serves.KEPT}


def _flat() -> dict[tuple[Phase, Event, Fallback], Phase]:
    """TABLE, one key a (phase, event, fallback)."""
    return {
        (here, event, fallback): there.of(fallback) if isinstance(there, ByFallback) else there
        for here, row in TABLE.items()
        for event, there in row.items()
        for fallback in Fallback
    }


TRANSITIONS: dict[tuple[Phase, Event, Fallback], Phase] = _flat()


def reported(phase: Phase, event: Event) -> Event:
    """``event`` as a step of ``phase`` reports it; a step that reports an event its phase may not
    (ok, fail, or the phase's one extra event) is a bug, named."""
    if event in (E.OK, E.FAIL) or EXTRA_EVENTS.get(phase) is event:
        return event
    raise StateError(f"the {phase.value!r} step reported {event.value!r}, which it may not report")


def failed(phase: Phase, exc: OrchestratorError) -> Event:
    """The event a step's error reports: ``fail``, unless the table names its type for the phase."""
    kind, event = RAISED_EVENTS.get(phase, (None, E.FAIL))
    return event if kind is not None and isinstance(exc, kind) else E.FAIL


def advance(phase: Phase, event: Event, fallback: Fallback = F.PREVIOUS) -> Phase:
    """The phase after ``event`` happens in ``phase`` to a deployment with ``fallback`` (TABLE's row)."""
    there = TABLE.get(phase, {}).get(event)
    if there is None:
        raise StateError(f"event {event.value!r} is not allowed in state {phase.value!r}")
    return there.of(fallback) if isinstance(there, ByFallback) else there


def is_terminal(phase: Phase) -> bool:
    return phase in ENDED


def moves_serving(phase: Phase) -> Serves | None:
    """What serves once a deployment enters ``phase``; None: the serving pointer stays."""
    return MOVES_SERVING.get(phase)
