"""`rollout status` of a rollout whose controller died says so, instead of "running"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orchestrator.core.rollout import Policy
from orchestrator.rollout.fleet import Fleet
from orchestrator.rollout.store import RolloutStore

from .conftest import make_catalog


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_rollout_whose_controller_died_reads_interrupted_naming_resume(tmp_path: Path) -> None:
    """Recorded running, its controller's pid gone (kill -9): status "interrupted", the way on named."""
    store = RolloutStore(tmp_path / "rollouts.db", group=None)
    rid = store.create("alpha", "edge", Policy(), "health", [("h1",), ("h2",)], dead_pid())
    ro = Fleet(make_catalog(state_dir=str(tmp_path)), store=store).summary(rid)["rollout"]
    assert (ro["status"], ro["controller"]["alive"]) == ("interrupted", False)
    assert "`orchestrator rollout resume`" in ro["reason"]


def test_a_rollout_with_its_controller_alive_reads_running(tmp_path: Path) -> None:
    """The controller is this process: still "running"."""
    store = RolloutStore(tmp_path / "rollouts.db", group=None)
    rid = store.create("alpha", "edge", Policy(), "health", [("h1",)], os.getpid())
    ro = Fleet(make_catalog(state_dir=str(tmp_path)), store=store).summary(rid)["rollout"]
    assert (ro["status"], ro["controller"]["alive"]) == ("running", True)
