"""A fleet rollout as pure decisions: the plan (canary, then batches), what to do after each batch,
and what to do with each host when a controller that died is resumed. No I/O here.

Every host moves through its own small state machine, recorded by the controller:

    pending -> staged -> switching -> switched            (its agent made the new model active)
                                   -> failed              (its agent rolled it back, or aborted before
                                                           stopping; or the gate failed and it was
                                                           rolled back by its agent on our request)
    switched -> reverted                                  (--rollback-all after the rollout stopped)

The words are Nomad's and Ansible's: ``canary`` hosts go first and alone; then ``batch`` hosts at a
time; more than ``max_failures`` failed hosts stop the rollout (a failed canary always stops it:
there is nothing to promote). Hosts never touched keep serving the old model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from orchestrator.core.states import Phase
from orchestrator.errors import UsageError


class HostState(StrEnum):
    PENDING = "pending"
    STAGED = "staged"
    SWITCHING = "switching"
    SWITCHED = "switched"
    FAILED = "failed"
    REVERTED = "reverted"


class RolloutStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # stopped on failures (or refused while staging); untouched hosts untouched
    ABORTED = "aborted"


ENDED = frozenset({HostState.SWITCHED, HostState.FAILED, HostState.REVERTED})
NOT_STARTED = frozenset({HostState.PENDING, HostState.STAGED})
# A box agent's deployment outcomes (core/states.py's ENDED) and a no-op switch.
_OUTCOME_STATE: dict[str, HostState] = {
    Phase.ACTIVE: HostState.SWITCHED,
    "noop": HostState.SWITCHED,
    Phase.ROLLED_BACK: HostState.FAILED,
    Phase.ABORTED: HostState.FAILED,
    Phase.FAILED: HostState.FAILED,
}


@dataclass(frozen=True)
class Policy:
    canary: int = 1
    batch: int = 1
    max_failures: int = 0
    rollback_all: bool = False


@dataclass(frozen=True)
class HostRecord:
    host: str
    batch: int  # 0: the canary batch (when there is one); order of switching
    state: HostState = HostState.PENDING
    baseline_id: int | None = None  # the box's newest deployment id before we switched it
    deployment_id: int | None = None
    outcome: str | None = None
    error: str | None = None


def plan(hosts: Sequence[str], canary: int, batch: int) -> list[tuple[str, ...]]:
    """Batches in order: the first ``canary`` hosts alone, then ``batch`` hosts at a time."""
    if not hosts:
        raise UsageError("a rollout needs at least one host")
    if canary < 0 or batch < 1:
        raise UsageError(f"canary must be >= 0 and batch >= 1 (got canary {canary}, batch {batch})")
    if canary >= len(hosts) and len(hosts) > 1:
        raise UsageError(
            f"canary {canary} covers all {len(hosts)} hosts of the group: nothing would be left "
            "to promote (use a smaller --canary)"
        )
    first = [tuple(hosts[:canary])] if canary else []
    rest = list(hosts[canary:])
    return first + [tuple(rest[i : i + batch]) for i in range(0, len(rest), batch)]


def state_of_outcome(outcome: str) -> HostState:
    """The host state a box agent's deployment outcome means."""
    try:
        return _OUTCOME_STATE[outcome]
    except KeyError:
        raise UsageError(f"deployment outcome {outcome!r} has not ended") from None


@dataclass(frozen=True)
class Decision:
    kind: Literal["switch", "wait", "stop", "done"]
    batch: int | None = None
    hosts: tuple[str, ...] = ()  # switch: these hosts now; wait: these are in flight on their agents
    revert: tuple[str, ...] = ()  # stop: switched hosts to return to the previous model (--rollback-all)
    reason: str = ""


def decide(records: Sequence[HostRecord], policy: Policy, *, has_canary: bool, aborted: bool = False) -> Decision:
    """What the controller does next, from the recorded host states alone."""
    in_flight = tuple(r.host for r in records if r.state is HostState.SWITCHING)
    if in_flight:
        return Decision("wait", hosts=in_flight, reason="switches still running on their agents")
    failed = [r for r in records if r.state is HostState.FAILED]
    canary_failed = has_canary and any(r.batch == 0 for r in failed)
    revert = tuple(r.host for r in records if r.state is HostState.SWITCHED) if policy.rollback_all else ()
    if aborted:  # the status says "aborted" already: the reason says what was left undone
        untouched = [r.host for r in records if r.state in NOT_STARTED]
        return Decision(
            "stop",
            revert=revert,
            reason="abort requested"
            + (f"; not switched: {', '.join(untouched)}" if untouched else "; every host had been switched"),
        )
    if canary_failed:
        return Decision(
            "stop", revert=revert, reason=f"canary {', '.join(r.host for r in failed if r.batch == 0)} failed"
        )
    if len(failed) > policy.max_failures:
        return Decision(
            "stop",
            revert=revert,
            reason=f"{len(failed)} host(s) failed ({', '.join(r.host for r in failed)}), more than "
            f"max_failures {policy.max_failures}",
        )
    waiting = [r for r in records if r.state in NOT_STARTED]
    if not waiting:
        return Decision("done")
    nxt = min(r.batch for r in waiting)
    return Decision("switch", batch=nxt, hosts=tuple(r.host for r in waiting if r.batch == nxt))


@dataclass(frozen=True)
class Observed:
    """What a host's agent says after a controller restart."""

    busy: bool  # an operation runs on the box now
    ours: str | None  # outcome of the newest deployment of the model after the baseline, if any
    ours_ended: bool = True
    serves_ours: bool = True  # the box serves the rollout's model now


ResumeAction = Literal["keep", "follow", "record", "superseded", "switch"]


def resume_action(record: HostRecord, observed: Observed) -> ResumeAction:
    """After a controller crash: a host whose deployment ended is never switched twice.

    keep: its state was recorded as ended; follow: its agent still runs it (wait for the end);
    record: it ended while no controller watched (take the agent's outcome); superseded: it became
    active, but the box serves another model now (another operation switched it since: failed, not
    switched); switch: the request never reached its agent (the plan still owes it a switch)."""
    if record.state in ENDED:
        return "keep"
    if record.state in NOT_STARTED:
        return "switch"
    if observed.busy or (observed.ours is not None and not observed.ours_ended):
        return "follow"
    if observed.ours == Phase.ACTIVE and not observed.serves_ours:
        return "superseded"
    if observed.ours is not None:
        return "record"
    return "switch"


def gate_failure(
    *,
    model: str,
    serving: str | None,
    healthy: bool | None,
    tok_s: float | None = None,
    previous_tok_s: float | None = None,
    min_ratio: float | None = None,
) -> str | None:
    """Why a switched host fails the gate between batches (None: it passes).

    health: the host serves ``model`` and its health check passes now; bench: the post-switch
    benchmark is at least ``min_ratio`` of the previous revision's tok/s."""
    if serving != model:
        return f"serves {serving or 'nothing'} instead of {model}"
    if healthy is False:
        return f"{model} is not healthy"
    if min_ratio is not None and previous_tok_s:
        if tok_s is None:
            return f"no post-switch benchmark of {model} to compare with {previous_tok_s:.1f} tok/s"
        if tok_s < min_ratio * previous_tok_s:
            return f"{tok_s:.1f} tok/s is below {min_ratio:g} x {previous_tok_s:.1f} tok/s of the previous revision"
    return None


def exit_code(status: RolloutStatus) -> int:
    return 0 if status is RolloutStatus.SUCCEEDED else 1


@dataclass(frozen=True)
class Rollout:
    id: int
    model: str
    group: str
    status: RolloutStatus
    policy: Policy
    canary: int
    gate: str
    started_at: float
    ended_at: float | None
    pid: int | None
    abort_requested: bool
    reason: str | None
    started_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "group": self.group,
            "status": self.status.value,
            "canary": self.canary,
            "batch": self.policy.batch,
            "max_failures": self.policy.max_failures,
            "rollback_all": self.policy.rollback_all,
            "gate": self.gate,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "reason": self.reason,
            "started_by": self.started_by,
            "abort_requested": self.abort_requested,
        }
