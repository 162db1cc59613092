"""Ctrl-C during an operation that runs in this process (no agent): the step finishes and parks, recorded;
the CLI says so (exit 130) and `status` calls the deployment interrupted, not running."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestrator.cli.deploy_cmds import print_status
from orchestrator.client.backends import LocalBackend
from orchestrator.contract.ops import RECOVER, SWITCH
from orchestrator.core.records import Deployment
from orchestrator.errors import Interrupted

from .conftest import OpsWorld

# On the box itself: no agentless SSH box lock to take (the fake ports answer for the host).
LOCAL = {"box": {"transport": "local", "gpus": 8, "gpu_memory_gib": 96}}


def ctrl_c_at(world: OpsWorld, phase: str, seen: list[dict[str, Any]] | None = None) -> None:
    """Send this process SIGINT (the terminal's Ctrl-C) when the switch reaches ``phase``."""

    def hook(dep: Deployment) -> None:
        if dep.phase.value == phase:
            if seen is not None:
                seen.append(world.ops.status(probe=False)["hosts"]["box"])
            os.kill(os.getpid(), signal.SIGINT)

    world.ops.before_step = hook


def test_ctrl_c_parks_the_switch_and_exits_130_naming_it(tmp_path: Path) -> None:
    """The switch stops after its step, recorded in its phase; the error names revision, phase and `recover`."""
    world = OpsWorld(tmp_path / "state", hosts=LOCAL)
    ctrl_c_at(world, "stopping")
    with pytest.raises(Interrupted) as info:
        LocalBackend(world.catalog, ops=world.ops).call(SWITCH, {"model": "alpha"})
    assert info.value.exit_code == 130
    assert (
        "interrupted (Ctrl-C): switch stopped after its current step: revision 1 (alpha) in phase stopping "
        "on box; nothing runs it now: `orchestrator recover` finishes it" in str(info.value)
    )
    [dep] = world.ops.unfinished("box")
    assert dep.phase.value == "stopping"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_status_calls_an_unfinished_deployment_nobody_holds_interrupted(tmp_path: Path) -> None:
    """While the switch holds the host it is running; after Ctrl-C, with nothing holding it, interrupted."""
    world = OpsWorld(tmp_path / "state", hosts=LOCAL)
    during: list[dict[str, Any]] = []
    ctrl_c_at(world, "stopping", during)
    with pytest.raises(Interrupted):
        LocalBackend(world.catalog, ops=world.ops).call(SWITCH, {"model": "alpha"})
    after = world.ops.status(probe=False)["hosts"]["box"]
    assert "interrupted" not in during[0] and during[0]["running"][0]["phase"] == "stopping"
    assert after["interrupted"] is True and after["running"][0]["phase"] == "stopping"


def test_status_text_says_interrupted_and_how_to_finish(tmp_path: Path) -> None:
    """The line reads `interrupted: #1 ...` with the command that finishes it, not `running:`."""
    world = OpsWorld(tmp_path / "state", hosts=LOCAL)
    ctrl_c_at(world, "stopping")
    with pytest.raises(Interrupted):
        LocalBackend(world.catalog, ops=world.ops).call(SWITCH, {"model": "alpha"})
    console = Console(record=True, width=400)
    print_status(console, world.ops.status(probe=False))
    [line] = [x for x in console.export_text().splitlines() if "#1" in x]
    assert line.startswith("  interrupted: #1 revision 1 alpha in phase stopping (")
    assert line.endswith(
        "); nothing runs it now: `orchestrator recover` finishes it (so does the next switch, or "
        "the agent when it starts)"
    )


def test_recover_finishes_the_interrupted_switch(tmp_path: Path) -> None:
    """`recover` drives the parked deployment to its outcome; status then shows nothing interrupted."""
    world = OpsWorld(tmp_path / "state", hosts=LOCAL)
    ctrl_c_at(world, "stopping")
    with pytest.raises(Interrupted):
        LocalBackend(world.catalog, ops=world.ops).call(SWITCH, {"model": "alpha"})
    world.ops.before_step = None
    [done] = world.ops.recover("box")
    assert done["outcome"] == "active" and "interrupted" not in world.ops.status(probe=False)["hosts"]["box"]


def test_ctrl_c_during_a_recovery_quits_at_once_instead_of_parking(tmp_path: Path) -> None:
    """An operation of several deployments (recover, tune) is not parked: it would start the next one."""
    world = OpsWorld(tmp_path / "state", hosts=LOCAL)
    ctrl_c_at(world, "stopping")
    backend = LocalBackend(world.catalog, ops=world.ops)
    with pytest.raises(Interrupted):
        backend.call(SWITCH, {"model": "alpha"})
    with pytest.raises(KeyboardInterrupt):
        backend.call(RECOVER, {"host": "box"})


@pytest.mark.parametrize(
    "outcome,text",
    [
        ("checking", "checking (unfinished)"),
        ("stopping", "stopping (unfinished)"),
        ("active", "active"),
        ("rolled_back", "rolled_back"),
        ("stopped", "stopped"),
    ],
)
def test_history_never_shows_a_phase_as_an_outcome(outcome: str, text: str) -> None:
    """A deployment left in a phase reads `checking (unfinished)` in history; ended ones read as they ended."""
    from orchestrator.cli.deploy_cmds import outcome_text

    assert outcome_text(outcome) == text


def test_status_after_a_failed_revision_names_it(tmp_path: Path) -> None:
    """Nothing serves after a first switch that failed: status opens naming its revision, model, outcome and error."""
    world = OpsWorld(tmp_path / "state", hosts=LOCAL)
    world.host.behaviours["vllm-alpha.service"] = "crash"
    LocalBackend(world.catalog, ops=world.ops).call(SWITCH, {"model": "alpha"})
    console = Console(record=True, width=400)
    print_status(console, world.ops.status(probe=False))
    first = console.export_text().splitlines()[0]
    assert first.startswith("box: nothing serves: revision 1 (alpha) ended failed: ")
