"""The warm path's safety on fake ports: the wake's memory is counted before anything sleeps, and a
rollback brings back what served beside a process that leaves room."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.deploy.operations import Operations

from .test_warm_switch import WarmWorld, warm_catalog


def route_of(config: str | None, name: str) -> str | None:
    """Where the proxy config sends ``name``: an engine's address, "503 (switching)", or None."""
    found = re.search(rf"^#\s+{re.escape(name)} -> (.+)$", config or "", re.MULTILINE)
    return None if found is None else found.group(1).strip()


class OpsWarmWorld(WarmWorld):
    """A WarmWorld driven through Operations (what the agent runs), alpha serving and
    beta asleep on the same GPUs 0-3."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(warm_catalog().model_copy(update={"state_dir": str(state_dir)}))
        ports = self.host.ports(self.catalog.hosts["box"], self.weights)
        ports.proxy = self.proxy
        self.ops = Operations(self.catalog, lambda name: ports, store=self.store, residency=self.residency)
        for model in ("alpha", "beta", "alpha"):
            assert self.ops.switch(model)["outcome"] == "active"
        assert self.states() == {"alpha": "serving", "beta": "asleep"}


@pytest.fixture
def ow(tmp_path: Path) -> OpsWarmWorld:
    return OpsWarmWorld(tmp_path)


def test_a_wake_that_cannot_fit_is_refused_before_anything_sleeps(ow: OpsWarmWorld) -> None:
    """A foreign 8 GiB on the GPU, beta's wake short once alpha sleeps: the switch aborts with the PID,
    MiB held and MiB needed, and alpha was never put to sleep nor its route moved."""
    hog = ow.host.hold([0], 8_192, "python")
    ow.proxy.applied.clear()
    ow.host.calls.clear()
    result = ow.ops.switch("beta")
    assert result["outcome"] == "aborted"
    assert "staging" in result["error"] and "nothing was put to sleep" in result["error"]
    assert f"PID {hog} (python) holds 8192 MiB on GPU 0" in result["error"]
    assert "the wake needs 87322 MiB more" in result["error"]
    assert not any(c.startswith(("sleep", "wake")) for c in ow.host.calls)
    assert ow.proxy.applied == [] and route_of(ow.proxy.config, "chat") == "127.0.0.1:8001"
    assert ow.states() == {"alpha": "serving", "beta": "asleep"}


def test_a_rollback_wakes_what_served_beside_a_process_that_leaves_room(ow: OpsWarmWorld) -> None:
    """A foreign 4 GiB stays on the GPU; beta's wake wedges and its cold restart cannot free the GPU of
    it: the rollback still wakes alpha (the memory is there) and the switch ends rolled back."""
    ow.host.hold([0], 4_096, "python")
    ow.host.engine_behaviours["vllm-beta.service"] = "wedged_wake"
    result = ow.ops.switch("beta")
    assert result["outcome"] == "rolled_back", result
    assert ow.states()["alpha"] == "serving"
    assert route_of(ow.proxy.config, "chat") == "127.0.0.1:8001"
