"""Operations keep only the engines that are running: what SIGTERM parks, and nothing that grows."""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.records import Deployment

from .conftest import OpsWorld


def test_finished_operations_retain_no_engine(tmp_path: Path) -> None:
    """Twenty-two operations (switches, rollbacks, recoveries, a stop) leave no engine held by the operations."""
    world = OpsWorld(tmp_path / "state")
    world.ops.switch("gamma")
    for _ in range(5):
        world.ops.switch("alpha")
        world.ops.switch("beta")
        world.ops.rollback("box")
        world.ops.recover("box")
    world.ops.stop("alpha")
    assert world.ops.deployers == set()


def test_park_all_parks_the_engine_that_is_running(tmp_path: Path) -> None:
    """SIGTERM during a switch parks it at the phase it reached; the engine is let go afterwards."""
    world = OpsWorld(tmp_path / "state")

    def sigterm_at_stopping(dep: Deployment) -> None:
        if dep.phase.value == "stopping":
            world.ops.park_all()

    world.ops.before_step = sigterm_at_stopping
    assert world.ops.switch("alpha")["outcome"] == "stopping"
    assert world.ops.deployers == set()
