"""The agent's loops on a fake clock: a failing pass is recorded and the loop goes on, the watch acts
on policy, due schedules fire, and a dead loop makes the agent withhold its watchdog pings."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.daemon import Agent
from orchestrator.agent.loops import Loop, dead
from orchestrator.agent.tasks import ScheduleTask
from tests.hosts.wait import wait_for

from .conftest import OpsWorld

REFUSED = "SSH connection to 127.0.0.9:22 refused"


class Submitted:
    """Records what a task asked the agent to run, instead of running it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], str]] = []

    def __call__(self, op: str, args: dict[str, Any], trigger: str) -> Any:
        self.calls.append((op, args, trigger))
        return type("Job", (), {"op": op})()


@pytest.fixture
def world(tmp_path: Path) -> OpsWorld:
    w = OpsWorld(tmp_path / "state")
    w.ops.switch("alpha")
    return w


@pytest.fixture
def agent(world: OpsWorld, tmp_path: Path) -> Iterator[Agent]:
    a = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    yield a
    a.stop()


def failures_counted(agent: Agent) -> float:
    return agent.metrics.registry.get_sample_value("orchestrator_loop_failures_total", {"loop": "watch"}) or 0.0


def test_an_unreachable_host_is_recorded_and_the_watch_goes_on(world: OpsWorld, agent: Agent) -> None:
    """A TransportError in a watch pass is an event, a log line and a metric; the next pass runs."""
    world.down = REFUSED
    agent.watch.tick()
    agent.watch.tick()
    assert [e["error"] for e in world.events("loop_failed")] == [f"host box: {REFUSED}"]  # once per streak
    assert failures_counted(agent) == 2.0
    world.down = None
    agent.watch.tick()
    assert world.events("loop_recovered")[0]["loop"] == "watch"


def test_the_watch_restarts_a_model_down_past_the_threshold(world: OpsWorld, agent: Agent) -> None:
    """After an outage, a unit that stays down for unhealthy_after_s is restarted by policy."""
    submitted = Submitted()
    agent.watch.submit = submitted
    world.down = REFUSED
    agent.watch.tick()
    world.down = None
    world.host.units["vllm-alpha.service"].active = "failed"
    agent.watch.tick()
    world.clock.sleep(world.catalog.policy.unhealthy_after_s - 1)
    agent.watch.tick()
    assert submitted.calls == []
    world.clock.sleep(1)
    agent.watch.tick()
    assert submitted.calls == [("switch", {"model": "alpha", "force": True}, "watch:restart")]
    assert world.events("unhealthy")[0]["unhealthy_s"] == world.catalog.policy.unhealthy_after_s


@pytest.fixture
def quick(tmp_path: Path) -> Iterator[tuple[OpsWorld, Agent]]:
    """A watch quicker than alpha's load deadline (5 s against 30 s), as a real engine's minutes of loading
    are against the shipped unhealthy_after_s = 60."""
    w = OpsWorld(tmp_path / "quick", policy={"unhealthy_after_s": 5})
    w.ops.switch("alpha")
    a = Agent(w.catalog, w.ops, socket=str(tmp_path / "quick.sock"), metrics_port=None, clock=w.clock)
    a.watch.submit = Submitted()
    yield w, a
    a.stop()


def restarted_by_systemd(world: OpsWorld, load_s: float) -> float:
    """alpha's engine was killed and systemd's Restart= started it again, for a cold load of load_s;
    returns alpha's load deadline."""
    world.clock.sleep(1)  # a while after the switch that made it serve
    unit = world.host.units["vllm-alpha.service"]
    unit.started_at, unit.restarts = world.clock.monotonic(), unit.restarts + 1
    world.host.load_s = load_s
    return world.catalog.defaults.load_deadline_s


def ticks(agent: Agent, world: OpsWorld, *at: float) -> list[tuple[str, dict[str, Any], str]]:
    """Watch passes at these seconds after now; what they submitted."""
    start = world.clock.monotonic()
    for t in at:
        world.clock.sleep(start + t - world.clock.monotonic())
        agent.watch.tick()
    return list(agent.watch.submit.calls)  # type: ignore[attr-defined]


def test_the_watch_leaves_an_engine_systemd_restarted_to_load(quick: tuple[OpsWorld, Agent]) -> None:
    """Unhealthy past unhealthy_after_s but within its load deadline since systemd's restart: left to load."""
    world, agent = quick
    deadline = restarted_by_systemd(world, load_s=28)
    assert ticks(agent, world, 0, 1, 10, 20, deadline - 3, 28) == []
    assert world.events("unhealthy") == []


def test_the_watch_restarts_an_engine_still_loading_past_its_deadline(quick: tuple[OpsWorld, Agent]) -> None:
    """The hold ends at the load deadline after the last start: then the policy acts."""
    world, agent = quick
    deadline = restarted_by_systemd(world, load_s=1000)
    assert ticks(agent, world, 0, 10, deadline - 1) == []
    assert ticks(agent, world, 2) == [("switch", {"model": "alpha", "force": True}, "watch:restart")]


def test_the_watch_acts_on_an_engine_that_loaded_before_it_went_unhealthy(quick: tuple[OpsWorld, Agent]) -> None:
    """The switch saw alpha healthy after its start: unhealthy now is not loading, the policy acts in time."""
    world, agent = quick
    world.host.behaviours["vllm-alpha.service"] = "never_ready"
    assert ticks(agent, world, 0, world.catalog.policy.unhealthy_after_s + 1) == [
        ("switch", {"model": "alpha", "force": True}, "watch:restart")
    ]


def test_a_failing_pass_does_not_end_the_loop(world: OpsWorld, agent: Agent) -> None:
    """A tick that raises is recorded, and the loop's thread runs the next pass."""
    passes: list[int] = []

    def tick() -> float:
        passes.append(1)
        if len(passes) == 1:
            raise RuntimeError("first pass breaks")
        agent.stop()
        return 0.0

    loop = Loop(
        "probe", tick, stopping=agent.stopping, clock=world.clock, failures=agent.failures, limit_s=300, retry_s=0.0
    )
    loop.start()
    loop.thread.join(10)
    assert len(passes) == 2
    failed = world.events("loop_failed")[0]
    assert (failed["loop"], failed["error"]) == ("probe", "RuntimeError: first pass breaks")


def test_a_loop_whose_thread_ended_is_dead(world: OpsWorld, agent: Agent) -> None:
    """A loop thread that has ended is reported dead at once, however recently it beat."""
    ended = threading.Event()

    def tick() -> float:
        ended.set()
        return 0.0

    loop = Loop("probe", tick, stopping=ended, clock=world.clock, failures=agent.failures, limit_s=300)
    loop.start()
    loop.thread.join(10)
    assert dead([loop], world.clock) == ["probe"]


def test_a_stalled_loop_withholds_the_watchdog(world: OpsWorld, agent: Agent) -> None:
    """Loops that made progress recently allow the ping; past their limit (fake clock) they do not."""
    for loop in agent.loops:
        loop.start()
    assert agent.loops_healthy()
    world.clock.sleep(301)  # the loops sleep on real time: on the fake clock they stopped beating
    assert not agent.loops_healthy()
    assert world.events("loop_dead")[0]["loops"] == ["schedules", "watch"]
    assert agent.metrics.registry.get_sample_value("orchestrator_loops_dead") == 2.0


def schedule_world(tmp_path: Path, **schedule: Any) -> OpsWorld:
    w = OpsWorld(tmp_path / "state", schedules={"nightly": {"cron": "0 3 * * *", "action": "redeploy", **schedule}})
    w.clock.start = datetime(2024, 5, 1, 2, 59, tzinfo=UTC).timestamp()
    w.ops.switch("alpha")
    return w


def test_a_due_schedule_fires_at_its_time(tmp_path: Path) -> None:
    """At 02:59 nothing runs; at 03:00 the redeploy is submitted and recorded as fired."""
    w = schedule_world(tmp_path)
    submitted = Submitted()
    task = ScheduleTask(w.catalog, w.ops, w.clock, submitted)
    assert task.tick() <= 30.0 and submitted.calls == []
    w.clock.sleep(60)
    task.tick()
    assert submitted.calls == [("switch", {"model": "alpha", "force": True}, "schedule:nightly")]
    assert w.events("schedule_fired")[0]["schedule"] == "nightly"


def test_a_schedule_outside_its_window_is_skipped(tmp_path: Path) -> None:
    """A 03:00 firing with a 04:00-05:00 window is recorded as skipped and runs nothing."""
    w = schedule_world(tmp_path, window="04:00-05:00")
    submitted = Submitted()
    task = ScheduleTask(w.catalog, w.ops, w.clock, submitted)
    w.clock.sleep(60)
    task.tick()
    assert submitted.calls == [] and w.events("schedule_skipped")[0]["reason"] == "outside window"


def test_a_schedule_due_while_its_host_is_busy_is_skipped_as_on_busy_says(tmp_path: Path) -> None:
    """on_busy = "skip": the firing is recorded as skipped, naming on_busy and what runs, and not queued."""
    from orchestrator.errors import Busy

    w = schedule_world(tmp_path)

    def busy(op: str, args: dict[str, Any], trigger: str) -> Any:
        raise Busy("host box is busy with switch beta (deployment #2 is in phase starting)", host="box")

    task = ScheduleTask(w.catalog, w.ops, w.clock, busy)
    w.clock.sleep(60)
    task.tick()
    [skipped] = w.events("schedule_skipped")
    assert skipped["on_busy"] == "skip" and skipped["reason"].startswith("host box is busy with switch beta")
    assert w.events("schedule_fired") == [] and sorted(task.next_runs) == ["nightly"]


def test_schedules_show_the_next_run_the_window_admits(tmp_path: Path) -> None:
    """'0 * * * *' with a 04:00-05:00 window at 02:59: `schedules` shows 04:00 (03:00 will be skipped)."""
    w = schedule_world(tmp_path, cron="0 * * * *", window="04:00-05:00")
    task = ScheduleTask(w.catalog, w.ops, w.clock, Submitted())
    [row] = w.ops.schedules(w.clock.now(), task.next_runs)
    assert row["next_run_ts"] == datetime(2024, 5, 1, 4, 0, tzinfo=UTC).timestamp()


def test_a_loop_with_a_wake_event_runs_its_next_pass_as_soon_as_it_is_set(world: OpsWorld, agent: Agent) -> None:
    """A pass asked to wait an hour: setting the loop's wake event runs the next one at once."""
    wake, second = threading.Event(), threading.Event()
    passes: list[int] = []

    def tick() -> float:
        passes.append(1)
        if len(passes) == 2:
            second.set()
            agent.stop()
            wake.set()  # what stops a loop with a wake event sets it too
        return 3600.0

    loop = Loop(
        "probe", tick, stopping=agent.stopping, clock=world.clock, failures=agent.failures, limit_s=7200, wake=wake
    )
    loop.start()
    wait_for(lambda: len(passes) == 1, timeout=10, what="the first pass")
    wake.set()
    assert second.wait(10)
    loop.thread.join(10)
    assert not loop.thread.is_alive()
