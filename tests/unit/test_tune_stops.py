"""A tune run asked to stop before its next candidate (rollout/tune.Tuner): an agent that stops parks
it (unfinished, for its restart), an abort ends it with what served before serving again. On the
unit tests' fake host, with a real tune store in the state dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core import tune as core
from orchestrator.errors import AgentError
from orchestrator.loadgen import BenchPlan
from orchestrator.rollout.tune import Tuner, tune_store

from .conftest import OpsWorld

BENCH = BenchPlan(concurrency=(1,), max_tokens=4, prompt_tokens=4, requests=1).to_dict()


def unfinished_run(world: OpsWorld) -> int:
    """alpha served (revision 1); a run of alpha over tp2 and tp4 recorded, nothing measured yet."""
    world.ops.switch("alpha")
    cands = [core.Candidate(f"alpha.{t}", core.parse_layout(t)).to_dict() for t in ("tp2", "tp4")]
    settings = {
        "candidates": cands,
        "objective": "throughput@1",
        "bench": BENCH,
        "repeats": 1,
        "restore": False,
        "previous_model": "alpha",
    }
    return tune_store(world.catalog).create("box", "alpha", settings, 1, world.clock.now()).id


@pytest.fixture
def world(tmp_path: Path) -> OpsWorld:
    return OpsWorld(tmp_path / "state")


def test_a_run_parked_by_a_stopping_agent_stays_unfinished_and_switches_nothing(world: OpsWorld) -> None:
    """should_park before the first candidate: an AgentError saying it resumes at the next start; the
    run is still unfinished and alpha still serves."""
    run = unfinished_run(world)
    with pytest.raises(AgentError, match=rf"tune run #{run} of alpha on host box parked before alpha.tp2"):
        Tuner(world.ops, None, should_park=lambda: True).resume("box")
    assert tune_store(world.catalog).unfinished("box") is not None
    assert world.ops.serving("box").model == "alpha"  # type: ignore[union-attr]


def test_an_abort_before_the_next_candidate_ends_the_run_with_what_served_before(world: OpsWorld) -> None:
    """should_stop before the first candidate: the run ends aborted, alpha serves, nothing was measured."""
    run = unfinished_run(world)
    result = Tuner(world.ops, None, should_stop=lambda: True).resume("box")
    assert (result["run"], result["state"], result["serving"]["model"]) == (run, "aborted", "alpha")
    assert tune_store(world.catalog).unfinished("box") is None and tune_store(world.catalog).results(run) == []
