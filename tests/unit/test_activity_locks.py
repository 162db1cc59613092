"""A box's activity locks (deploy/locks.activity_lock): one bench, tune run or staging per box at a time;
a second one is Busy (exit 5) naming the box, what holds it and since when, never a pseudo host
("host box.bench"); the on-demand broker reads the same holder (activity_holder)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.core import tune as core
from orchestrator.deploy.locks import activity_holder, activity_lock
from orchestrator.errors import Busy
from orchestrator.loadgen import BenchPlan
from orchestrator.rollout.tune import Tuner, tune_store
from tests.builders.catalog import ONE_BOX_TOML

from .cli_runner import invoke
from .conftest import OpsWorld

SINCE = r"since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}"


@pytest.fixture
def world(tmp_path: Path) -> OpsWorld:
    return OpsWorld(tmp_path / "state")


def test_a_held_activity_names_its_holder_and_a_free_one_nothing(tmp_path: Path) -> None:
    """activity_holder: None before and after, "a bench of alpha is running since T" while held."""
    state = str(tmp_path)
    assert activity_holder(state, "box", "bench") is None
    with activity_lock(state, "box", "bench", "a bench of alpha is running"):
        held = activity_holder(state, "box", "bench")
        assert held is not None and re.fullmatch(f"a bench of alpha is running {SINCE}", held), held
        assert activity_holder(state, "box", "tune") is None
    assert activity_holder(state, "box", "bench") is None


def test_a_second_tune_run_on_a_box_is_busy_naming_the_box_and_the_first(world: OpsWorld) -> None:
    """A tune run resumed while another drives the box's run: Busy, exit 5, "host box: busy, a tune of
    alpha is running since T" (the first asked, between its candidates, for the second)."""
    world.ops.switch("alpha")
    cands = [core.Candidate("alpha.tp4", core.parse_layout("tp4")).to_dict()]
    tune_store(world.catalog).create(
        "box",
        "alpha",
        {
            "candidates": cands,
            "objective": "throughput@1",
            "restore": False,
            "previous_model": "alpha",
            "repeats": 1,
            "bench": BenchPlan(concurrency=(1,), max_tokens=4, prompt_tokens=4, requests=1).to_dict(),
        },
        1,
        0.0,
    )
    refused: list[Busy] = []

    def second() -> bool:
        with pytest.raises(Busy) as info:
            Tuner(world.ops, None).resume("box")
        refused.append(info.value)
        return True  # then the first parks: nothing switches

    with pytest.raises(Exception, match="parked"):
        Tuner(world.ops, None, should_park=second).resume("box")
    assert len(refused) == 1 and refused[0].exit_code == 5
    assert re.match(f"host box: busy, a tune of alpha is running {SINCE}; wait for it", str(refused[0])), str(
        refused[0]
    )


def test_a_second_bench_on_a_box_exits_5_naming_the_box_and_the_first(tmp_path: Path) -> None:
    """`bench` while another bench of alpha holds the box: exit 5, "host box: busy, a bench of alpha is
    running since T", nothing about a host "box.bench"; no load is sent."""
    from orchestrator.deploy.operations import Operations
    from orchestrator.testing import FakeHost, FakeWeights

    state = tmp_path / "state"
    world = OpsWorld(state)
    ports = FakeHost(name="box").ports(world.catalog.hosts["box"], FakeWeights())
    Operations(world.catalog, lambda name: ports).switch("alpha")  # recorded in the state dir's state.db
    (tmp_path / "deploy.toml").write_text(ONE_BOX_TOML.format(state=state, extra=""))
    with activity_lock(str(state), "box", "bench", "a bench of alpha is running"):
        result = invoke("bench", "--config", str(tmp_path / "deploy.toml"), "--requests", "1", "--concurrency", "1")
    assert result.exit_code == 5, result.output
    assert re.search(f"host box: busy, a bench of alpha is running {SINCE}", result.output), result.output
    assert "box.bench" not in result.output


def test_a_second_staging_on_a_box_is_busy_naming_the_box_and_the_first(world: OpsWorld) -> None:
    """`stage beta` while alpha stages (asked from alpha's progress): Busy, exit 5, "host box: busy, a stage
    of alpha is running since T"; alpha's staging ends as usual."""
    refused: list[Busy] = []

    def progress(event: str, fields: dict[str, object]) -> None:
        with pytest.raises(Busy) as info:
            world.ops.stage("beta")
        refused.append(info.value)

    assert world.ops.stage("alpha", progress=progress)["model"] == "alpha"
    assert len(refused) == 1 and refused[0].exit_code == 5 and "box.stage" not in str(refused[0])
    assert re.match(f"host box: busy, a stage of alpha is running {SINCE}", str(refused[0])), str(refused[0])
