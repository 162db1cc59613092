"""`rollout status` of a rollout whose controller died says so, instead of "running"."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from orchestrator.client.backends import AgentClient
from orchestrator.core.rollout import HostState, Policy
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


class Box(AgentClient):
    """A box's agent that answers each operation from ``replies`` (what status and history say)."""

    def __init__(self, replies: dict[str, Any]) -> None:
        super().__init__("box.sock")
        self.replies = replies

    def open_stream(self) -> Any:
        ours, agent = socket.socketpair()

        def answer() -> None:
            with agent, agent.makefile("rb") as stream:
                op = json.loads(stream.readline())["op"]
                agent.sendall(json.dumps({"result": self.replies[op]}).encode() + b"\n")

        threading.Thread(target=answer, daemon=True).start()
        return ours


def test_resume_does_not_mark_switched_a_host_that_serves_another_model_now(tmp_path: Path) -> None:
    """The controller died while box switched to beta; another operation then put gamma there: resume
    records box as failed (superseded, naming gamma), and the rollout fails instead of succeeding."""
    store = RolloutStore(tmp_path / "rollouts.db", group=None)
    rid = store.create("beta", "edge", Policy(canary=1), "health", [("box",)], dead_pid())
    store.set_host(rid, "box", state=HostState.SWITCHING, baseline_id=1)
    box = Box(
        {
            "status": {
                "hosts": {"box": {"serving": {"model": "gamma", "revision": 4}, "running": []}},
                "agent": {"running": {}},
            },
            "history": [
                {"id": 4, "model": "gamma", "outcome": "active", "ended_at": 2.0, "revision": 4},
                {"id": 3, "model": "beta", "outcome": "active", "ended_at": 1.0, "revision": 3},
            ],
        }
    )
    fleet = Fleet(make_catalog(state_dir=str(tmp_path)), store=store, connect=lambda host: box)
    result = fleet.resume(rid)
    [host] = result["hosts"]
    assert (result["rollout"]["status"], host["state"], host["outcome"]) == ("failed", "failed", "superseded")
    assert "serves gamma now" in host["error"]
