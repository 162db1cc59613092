"""The agent's watch decisions (pure: readings and times in, decisions out).

Four rules: when a serving model has been unhealthy long enough to act on, when its engine must
be left alone anyway (systemd is starting it, or it is still within its load deadline), when one
of the agent's own loops has stopped making progress (then the agent stops its watchdog pings so
systemd restarts it), and which model a failed switch left without a route, to wake once its
memory is back. Times come from the Clock port, so tests drive them with a fake clock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.core.observed import UnitState
from orchestrator.core.records import Deployment
from orchestrator.core.states import Phase

# A loop that has not started a pass for this long is stuck (a hung SSH call, a dead thread).
STALL_FLOOR_S = 300.0


@dataclass(frozen=True)
class Judgement:
    """``since``: when the current unhealthy streak began (None: healthy); ``act``: do the policy now."""

    since: float | None
    act: bool
    unhealthy_s: float = 0.0


def judge(
    since: float | None, healthy: bool, now: float, unhealthy_after_s: float, held: str | None = None
) -> Judgement:
    """One health reading of a serving model. Acting ends the streak: the next one starts afresh.
    ``held`` (see ``hold_off``): the streak goes on but nothing is done while the engine loads."""
    if healthy:
        return Judgement(None, False)
    start = now if since is None else since
    lasted = now - start
    if lasted >= unhealthy_after_s and held is None:
        return Judgement(None, True, lasted)
    return Judgement(start, False, lasted)


def hold_off(unit: UnitState, now: float, load_deadline_s: float, healthy_at: float | None = None) -> str | None:
    """Why the watch must not restart this engine now (None: it may): systemd is restarting or
    stopping the unit, or is running or starting it and its main process started less than its load
    deadline ago without answering healthy since (``healthy_at``: when it last did). A restart by
    systemd itself (Restart=) counts as a start: a real engine loads for minutes after a crash, and a
    restart by the watch in the middle would only begin that load again."""
    if unit.sub_state == "auto-restart" or unit.active_state == "deactivating":
        return f"{unit.name} is {unit.active_state} ({unit.sub_state})"  # bounded: RestartSec, TimeoutStopSec
    if unit.active_state not in ("active", "activating", "reloading"):
        return None  # failed or inactive: nothing but the policy brings it back
    if unit.started_at is None:
        return None if unit.active_state == "active" else f"{unit.name} is {unit.active_state} ({unit.sub_state})"
    age = now - unit.started_at
    if age >= load_deadline_s or (healthy_at is not None and healthy_at >= unit.started_at):
        return None  # past its deadline, or it loaded since this start
    return (
        f"{unit.name} ({unit.active_state}) started {max(age, 0.0):.0f} s ago (restarts by systemd: "
        f"{unit.n_restarts}), within its load deadline of {load_deadline_s:g} s"
    )


def stall_limit(interval_s: float) -> float:
    """How long a loop that wakes every ``interval_s`` may go without starting a pass."""
    return max(STALL_FLOOR_S, 4 * interval_s)


@dataclass(frozen=True)
class LoopBeat:
    """What the agent knows of one loop: is its thread alive, when did its last pass start."""

    alive: bool
    last_beat: float
    limit_s: float


def dead_loops(loops: Mapping[str, LoopBeat], now: float) -> list[str]:
    """The loops that exited or have not beaten within their limit (monotonic seconds)."""
    return sorted(name for name, b in loops.items() if not b.alive or now - b.last_beat > b.limit_s)


def to_bring_back(
    last: Deployment | None, displaced: Sequence[Deployment], routed: Collection[str]
) -> Deployment | None:
    """After the host's newest switch failed (its rollback too): the first model it displaced whose
    served name no engine serves now (the proxy answers 503 + Retry-After for it). Only a failed
    switch's own models: a revival that fails is a newer failed switch that displaced nothing, so
    nothing is retried in a loop."""
    if last is None or last.phase is not Phase.FAILED:
        return None
    return next((d for d in displaced if d.spec.served_name not in routed), None)


@dataclass(frozen=True)
class Revival:
    """``act``: bring the model back now (its wake fits); ``say``: record why not (once per failure)."""

    act: bool
    say: bool


def judge_revival(blockers: Sequence[str], *, said: bool, tried: bool) -> Revival:
    """A lost model's wake is tried once, when nothing blocks it; until then why not is said once."""
    if tried:
        return Revival(act=False, say=False)
    if not blockers:
        return Revival(act=True, say=False)
    return Revival(act=False, say=not said)
