"""The agent's residency gauge, orchestrator_model_residency{host,model,state,level}: per model one series
for each state it can be in (awake; asleep at its sleep level, for a model that sleeps; stopped), 1 for
the state its record says, updated as each job ends (warm switches over a fake host)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from orchestrator.agent.daemon import Agent
from orchestrator.agent.server import Job
from orchestrator.core.resident import ASLEEP, Residency, residency_series
from orchestrator.deploy.operations import Operations
from orchestrator.testing import FakeResidencyStore
from tests.hosts.wait import wait_for

from .conftest import OpsWorld

WARM = {"tensor_parallel": 4, "gpus": [0, 1, 2, 3], "sleep": "level1"}


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    """a and b sleep at level 1 on GPUs 0-3; c never sleeps (4-7)."""
    world = OpsWorld(
        tmp_path / "state",
        proxy={"enabled": True, "port": 9000},
        hosts={
            "box": {
                "transport": "ssh",
                "address": "127.0.0.9",
                "gpus": 8,
                "gpu_memory_gib": 96,
                "sleep_ram_gib": 100,
                "sleep_residue_gib": 2,
            }
        },
        models={
            "a": {"repo": "org/a", "port": 8001, **WARM},
            "b": {"repo": "org/b", "port": 8002, **WARM},
            "c": {"repo": "org/c", "port": 8003, "tensor_parallel": 4, "gpus": [4, 5, 6, 7]},
        },
    )
    return Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)


def switch(agent: Agent, model: str) -> None:
    job = agent._submit("switch", {"model": model}, "alice")
    assert job.done.wait(30) and (job.result or {}).get("result", {}).get("outcome") == "active", job.result


def gauge(agent: Agent) -> dict[tuple[str, str, str], float]:
    """(model, state, level) -> value, for host box."""
    fam = next(f for f in agent.metrics.registry.collect() if f.name == "orchestrator_model_residency")
    return {
        (s.labels["model"], s.labels["state"], s.labels["level"]): s.value
        for s in fam.samples
        if s.labels["host"] == "box"
    }


def current(agent: Agent) -> dict[str, tuple[str, str]]:
    """model -> (state, level) of its series at 1."""
    return {m: (s, lv) for (m, s, lv), v in gauge(agent).items() if v == 1}


def test_each_model_has_one_series_per_possible_state_and_only_the_current_is_1(agent: Agent) -> None:
    """After a then b (same GPUs): a asleep at level 1, b awake, c stopped;
    c, which never sleeps, has no asleep series."""
    switch(agent, "a")
    switch(agent, "b")
    wait_for(lambda: gauge(agent), lambda g: g[("b", "awake", "")] == 1, timeout=10, what="b's job ended")
    assert gauge(agent) == {
        ("a", "awake", ""): 0,
        ("a", "asleep", "1"): 1,
        ("a", "stopped", ""): 0,
        ("b", "awake", ""): 1,
        ("b", "asleep", "1"): 0,
        ("b", "stopped", ""): 0,
        ("c", "awake", ""): 0,
        ("c", "stopped", ""): 1,
    }


def test_the_gauge_follows_each_job_as_it_ends(agent: Agent) -> None:
    """A wake of a (b to sleep) moves both series at the job's end, without a scrape-time read."""
    switch(agent, "a")
    switch(agent, "b")
    switch(agent, "a")
    wait_for(lambda: current(agent), lambda now: now["a"] == ("awake", ""), timeout=10, what="a's wake ended")
    assert current(agent) == {"a": ("awake", ""), "b": ("asleep", "1"), "c": ("stopped", "")}


def test_a_sleeper_reports_the_level_it_sleeps_at() -> None:
    """A model recorded asleep at level 2 reads level 2, whatever its configured level now; one in the
    serving set is awake without a record (a box without warm switches keeps none)."""
    records = {"a": Residency("box", "a", ASLEEP, 0.0, level="level2")}
    series = residency_series({"a": "level1", "b": None}, {"b"}, records)
    assert series == [
        ("a", "awake", "", 0),
        ("a", "asleep", "2", 1),
        ("a", "stopped", "", 0),
        ("b", "awake", "", 1),
        ("b", "stopped", "", 0),
    ]


def test_a_box_without_warm_switches_reports_its_serving_model_awake(tmp_path: Path) -> None:
    """No proxy, no sleep mode (so no residency records): after a switch to alpha it reads awake, the others stopped."""
    world = OpsWorld(tmp_path / "state")
    plain = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    switch(plain, "alpha")
    wait_for(
        lambda: current(plain), lambda now: now.get("alpha") == ("awake", ""), timeout=10, what="alpha's job ended"
    )
    assert current(plain) == {"alpha": ("awake", ""), "beta": ("stopped", ""), "gamma": ("stopped", "")}


class _ReadAfterDone(FakeResidencyStore):
    """A residency store whose reads after the watched job is done wait until the test has looked at the
    gauge: a gauge refreshed only after ``done`` is then deterministically seen stale."""

    def __init__(self) -> None:
        super().__init__()
        self.job: Job | None = None
        self.looked = threading.Event()

    def residency(self, host: str) -> dict[str, Residency]:
        if self.job is not None and self.job.done.is_set():
            self.looked.wait(10)
        return super().residency(host)


def test_the_gauge_is_current_when_each_of_two_back_to_back_jobs_is_seen_done(tmp_path: Path) -> None:
    """Read the moment each job is done (a then b, same GPUs), the gauge already says what that job left."""
    world = OpsWorld(
        tmp_path / "state",
        proxy={"enabled": True, "port": 9000},
        hosts={
            "box": {
                "transport": "ssh",
                "address": "127.0.0.9",
                "gpus": 8,
                "gpu_memory_gib": 96,
                "sleep_ram_gib": 100,
                "sleep_residue_gib": 2,
            }
        },
        models={"a": {"repo": "org/a", "port": 8001, **WARM}, "b": {"repo": "org/b", "port": 8002, **WARM}},
    )
    store = _ReadAfterDone()
    ops = Operations(world.catalog, world.ops.ports_for, store=world.store, residency=store)
    agent = Agent(world.catalog, ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    seen = []
    for model in ("a", "b"):
        store.looked.clear()
        store.job = agent._submit("switch", {"model": model}, "alice")
        assert store.job.done.wait(30)
        seen.append(current(agent))
        store.looked.set()
    assert seen == [{"a": ("awake", ""), "b": ("stopped", "")}, {"a": ("asleep", "1"), "b": ("awake", "")}]
