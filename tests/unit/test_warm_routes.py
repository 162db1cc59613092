"""The warm path's safety on fake ports: the wake's memory is counted before anything sleeps, a
rollback brings back what served beside a process that leaves room, a route never points at an
engine that is asleep or restarting (503 + Retry-After instead), and the watch wakes what a failed
switch left once its memory is back."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.loops import Failures
from orchestrator.agent.metrics import Metrics
from orchestrator.agent.tasks import WatchTask
from orchestrator.core.records import Deployment
from orchestrator.core.states import Phase
from orchestrator.deploy.operations import Operations

from .test_warm_switch import TP4, WarmWorld, warm_catalog

GAP = "503 (switching)"


def route_of(config: str | None, name: str) -> str | None:
    """Where the proxy config sends ``name``: an engine's address, GAP, or None (not routed)."""
    found = re.search(rf"^#\s+{re.escape(name)} -> (.+)$", config or "", re.MULTILINE)
    return None if found is None else found.group(1).strip()


class OpsWarmWorld(WarmWorld):
    """A WarmWorld driven through Operations (what the agent and its watch run), alpha serving and
    beta asleep on the same GPUs 0-3."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(warm_catalog().model_copy(update={"state_dir": str(state_dir)}))
        ports = self.host.ports(self.catalog.hosts["box"], self.weights)
        ports.proxy = self.proxy
        self.ops = Operations(self.catalog, lambda name: ports, store=self.store, residency=self.residency)
        for model in ("alpha", "beta", "alpha"):
            assert self.ops.switch(model)["outcome"] == "active"
        assert self.states() == {"alpha": "serving", "beta": "asleep"}

    def watch(self) -> WatchTask:
        """The agent's watch over these operations; its switches run at once, in this thread."""
        metrics = Metrics(None)
        return WatchTask(
            self.catalog,
            self.ops,
            self.host.clock,
            lambda op, args, trigger: self.ops.switch(args["model"], trigger=trigger),
            lambda host: False,
            metrics,
            Failures(self.host.clock, lambda at, host, kind, detail: None, metrics),
        )


@pytest.fixture
def ow(tmp_path: Path) -> OpsWarmWorld:
    return OpsWarmWorld(tmp_path)


def hog_at(ow: OpsWarmWorld, phase: Phase, mib: int) -> list[int]:
    """From ``phase`` of the next switch on, a foreign process holds ``mib`` on GPU 0; its PID."""
    pids: list[int] = []

    def hook(dep: Deployment) -> None:
        if dep.phase is phase and not pids:
            pids.append(ow.host.hold([0], mib, "python"))

    ow.ops.before_step = hook
    return pids


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


def test_a_displaced_engine_without_sleep_mode_counts_all_its_memory_as_given_back() -> None:
    """alpha has no sleep mode (it stops, keeping nothing): beta's wake fits beside an 8000 MiB process
    that would not leave room had alpha kept a sleeper's residue, and the switch goes through."""
    plain = {k: v for k, v in TP4.items() if k != "sleep"}
    catalog = warm_catalog(
        alpha={"repo": "org/alpha", "port": 8001, **plain}, beta={"repo": "org/beta", "port": 8002, **TP4}
    )
    ww = WarmWorld(catalog)
    assert ww.switch("beta").phase is Phase.ACTIVE and ww.switch("alpha").phase is Phase.ACTIVE
    ww.host.hold([0], 8_000, "python")
    back = ww.switch("beta")
    assert back.phase is Phase.ACTIVE, back.error
    assert ww.phases(back.id)[-4:] == ["sleeping", "verifying", "waking", "routing"]


def test_a_failed_rollback_leaves_the_name_answering_503_not_routed_to_a_sleeper(ow: OpsWarmWorld) -> None:
    """A process takes beta's memory while it verifies and stays: the rollback cannot wake alpha either,
    the switch ends failed, and the proxy answers 503 + Retry-After for the name instead of sending
    requests to an engine that sleeps."""
    hog_at(ow, Phase.VERIFYING, 90_000)
    result = ow.ops.switch("beta")
    assert result["outcome"] == "failed", result
    assert ow.states() == {"alpha": "asleep", "beta": "asleep"}
    assert route_of(ow.proxy.config, "chat") == GAP


def test_the_watch_says_why_not_then_wakes_what_served_once_the_blocker_leaves(ow: OpsWarmWorld) -> None:
    """After that failed switch the watch records, once, the PID that keeps alpha asleep; when it
    leaves, the watch switches back to alpha (warm) and the route comes back to alpha's engine."""
    hog = hog_at(ow, Phase.VERIFYING, 90_000)
    assert ow.ops.switch("beta")["outcome"] == "failed"
    ow.ops.before_step = None
    watch = ow.watch()
    watch.tick()
    watch.tick()
    waiting = ow.store.events(kind="revive_waiting", limit=10)
    assert len(waiting) == 1 and waiting[0]["model"] == "alpha"
    assert any(f"PID {hog[0]} (python) holds 90000 MiB on GPU 0" in r for r in waiting[0]["reasons"])
    assert ow.states()["alpha"] == "asleep"
    del ow.host.holders[hog[0]]
    watch.tick()
    newest = ow.ops.history("box", 1)[0]
    assert (newest["model"], newest["outcome"], newest["trigger"]) == ("alpha", "active", "watch:revive")
    assert ow.states() == {"alpha": "serving", "beta": "asleep"}
    assert route_of(ow.proxy.config, "chat") == "127.0.0.1:8001"


def test_a_wedged_wake_restarts_with_its_route_off(ow: OpsWarmWorld) -> None:
    """beta's wake wedges: while it restarts cold and is checked, its name answers 503 + Retry-After
    (not beta's resets or loading 503s); once it serves, the route is back on beta."""
    ow.host.engine_behaviours["vllm-beta.service"] = "wedged_wake"
    seen: dict[str, Any] = {}

    def hook(dep: Deployment) -> None:
        if dep.phase is Phase.CHECKING:
            seen["checking"] = route_of(ow.proxy.config, "chat")

    ow.ops.before_step = hook
    result = ow.ops.switch("beta")
    assert result["outcome"] == "active", result
    assert seen == {"checking": GAP}
    assert route_of(ow.proxy.config, "chat") == "127.0.0.1:8002"
