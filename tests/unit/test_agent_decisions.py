"""The agent's decisions as pure functions of time: when schedules are due, when to act on health,
when one of its own loops counts as dead."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestrator.core import schedule as sched
from orchestrator.core.catalog import Schedule
from orchestrator.core.observed import UnitState
from orchestrator.core.watch import (
    STALL_FLOOR_S,
    LoopBeat,
    dead_loops,
    hold_off,
    judge,
    judge_revival,
    stall_limit,
)


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


NIGHTLY = Schedule(name="nightly", cron="0 3 * * *", action="redeploy")


def test_unhealthy_shorter_than_the_threshold_does_not_act() -> None:
    """A streak younger than unhealthy_after_s is remembered, not acted on."""
    first = judge(None, False, 100.0, 60.0)
    later = judge(first.since, False, 159.0, 60.0)
    assert (first.since, first.act, later.since, later.act) == (100.0, False, 100.0, False)


def test_unhealthy_for_the_threshold_acts_once_and_starts_afresh() -> None:
    """At unhealthy_after_s the policy runs, with how long it lasted, and the streak resets."""
    verdict = judge(100.0, False, 160.0, 60.0)
    assert (verdict.act, verdict.since, verdict.unhealthy_s) == (True, None, 60.0)


def test_a_healthy_reading_ends_the_streak() -> None:
    """One healthy reading forgets an unhealthy streak."""
    assert judge(100.0, True, 159.0, 60.0).since is None


def engine(
    active: str = "active", sub: str = "running", started_at: float | None = 1000.0, restarts: int = 1
) -> UnitState:
    return UnitState("vllm-alpha.service", "loaded", active, sub, 4242, 0, restarts, started_at=started_at)


@pytest.mark.parametrize("active,sub", [("activating", "auto-restart"), ("deactivating", "stop-sigterm")])
def test_a_unit_systemd_is_restarting_or_stopping_is_held(active: str, sub: str) -> None:
    """Waiting to auto-restart or deactivating (bounded by RestartSec, TimeoutStopSec): left to systemd."""
    assert hold_off(engine(active, sub), 5000.0, 900.0) == f"vllm-alpha.service is {active} ({sub})"


def test_a_unit_starting_is_held_within_its_load_deadline_only() -> None:
    """Activating: held from its start for its load deadline, not for ever (a start that never ends)."""
    assert hold_off(engine("activating", "start"), 1010.0, 900.0) is not None
    assert hold_off(engine("activating", "start"), 1900.0, 900.0) is None


def test_an_engine_restarted_by_systemd_is_held_within_its_load_deadline() -> None:
    """58 s into a cold start after systemd's own restart: held, however long it has been unhealthy."""
    held = hold_off(engine(started_at=1000.0), 1058.0, 900.0, healthy_at=990.0)
    assert held is not None and "started 58 s ago" in held and "restarts by systemd: 1" in held
    verdict = judge(990.0, False, 1058.0, 60.0, held)
    assert (verdict.act, verdict.since, verdict.unhealthy_s) == (False, 990.0, 68.0)


def test_an_engine_past_its_load_deadline_is_not_held() -> None:
    """Its load deadline after its last start the hold ends and the unhealthy streak is acted on."""
    assert hold_off(engine(started_at=1000.0), 1900.0, 900.0) is None
    assert judge(990.0, False, 1900.0, 60.0, None).act


def test_an_engine_healthy_since_its_start_is_not_held() -> None:
    """It loaded (answered healthy after its start): unhealthy now is not loading, the policy may act."""
    assert hold_off(engine(started_at=1000.0), 1100.0, 900.0, healthy_at=1040.0) is None


@pytest.mark.parametrize("active", ["failed", "inactive"])
def test_a_dead_unit_is_not_held(active: str) -> None:
    """Failed or inactive, systemd restarts nothing: the policy may act even soon after its start."""
    assert hold_off(engine(active, "dead", started_at=1000.0), 1010.0, 900.0) is None


def test_a_lost_model_blocked_is_explained_once_and_not_woken() -> None:
    """While its wake does not fit, why not is recorded on the first pass only, and nothing is tried."""
    first = judge_revival(["PID 7 holds 8192 MiB"], said=False, tried=False)
    again = judge_revival(["PID 7 holds 8192 MiB"], said=True, tried=False)
    assert (first.act, first.say, again.act, again.say) == (False, True, False, False)


def test_a_lost_model_is_woken_once_when_nothing_blocks_it() -> None:
    """A wake that fits is tried; after that try the same failure is never acted on again."""
    assert judge_revival([], said=True, tried=False).act
    assert not judge_revival([], said=True, tried=True).act


def test_a_loop_that_beats_within_its_limit_is_alive() -> None:
    """A running loop whose last pass began within its limit is not reported."""
    assert dead_loops({"watch": LoopBeat(True, 1000.0, 300.0)}, 1299.0) == []


def test_a_loop_that_stopped_beating_is_dead() -> None:
    """A running thread without a pass for longer than its limit is reported (a hung call)."""
    assert dead_loops({"watch": LoopBeat(True, 1000.0, 300.0), "schedules": LoopBeat(True, 1290, 300.0)}, 1301.0) == [
        "watch"
    ]


def test_a_loop_whose_thread_exited_is_dead_at_once() -> None:
    """An exited thread is dead however recently it beat."""
    assert dead_loops({"schedules": LoopBeat(False, 1000.0, 300.0)}, 1000.0) == ["schedules"]


def test_stall_limit_grows_with_long_intervals() -> None:
    """Short intervals get the floor; a loop that sleeps long gets four of its intervals."""
    assert (stall_limit(1.0), stall_limit(600.0)) == (STALL_FLOOR_S, 2400.0)


def test_nothing_is_due_before_its_time() -> None:
    """A minute before 03:00 the nightly schedule is not due."""
    runs = sched.first_runs({"nightly": NIGHTLY}, at("2024-05-01T02:58:00"))
    assert sched.due(runs, at("2024-05-01T02:59:00")) == []


def test_a_schedule_is_due_at_its_time() -> None:
    """At 03:00:01 the nightly schedule is due, with its due time."""
    runs = sched.first_runs({"nightly": NIGHTLY}, at("2024-05-01T02:58:00"))
    assert sched.due(runs, at("2024-05-01T03:00:01")) == [("nightly", at("2024-05-01T03:00:00"))]


def test_runs_missed_while_down_collapse_into_one() -> None:
    """An agent back after three days fires the nightly schedule once, next at the coming 03:00."""
    nxt = sched.after_firing(NIGHTLY, at("2024-05-01T03:00:00"), at("2024-05-04T12:00:00"))
    assert nxt == at("2024-05-05T03:00:00")


def test_due_schedules_come_earliest_first() -> None:
    """Two due schedules are returned in the order they were due."""
    assert sched.due({"b": 20.0, "a": 30.0, "c": 99.0}, 50.0) == [("b", 20.0), ("a", 30.0)]


def test_windows_wrap_midnight() -> None:
    """A 22:00-02:00 window holds at 23:30 and 01:00, not at 12:00."""
    s = Schedule(name="n", cron="0 * * * *", action="redeploy", window="22:00-02:00")
    assert [sched.in_window(s, at(f"2024-05-01T{t}")) for t in ("23:30:00", "01:00:00", "12:00:00")] == [
        True,
        True,
        False,
    ]


@pytest.mark.parametrize("window", ["25:99-99:00", "12:00-24:00"])
def test_an_impossible_window_is_refused_up_front(window: str) -> None:
    """A window with hours or minutes out of range is refused when the schedule is built, naming it,
    not a crash at firing time."""
    with pytest.raises(ValueError, match=f"window '{window}'"):
        sched.validate(Schedule(name="n", cron="0 * * * *", action="redeploy", window=window))
