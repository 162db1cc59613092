"""The fleet controller (agent/controller.py): a rollout is a job of the controller's agent, driven
by the real fleet code against simulated box agents, recorded in the in-memory rollout store, on a
fake clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.controller import FleetController
from orchestrator.contract.args import RolloutStartArgs
from orchestrator.core.catalog import Catalog
from orchestrator.core.rollout import HostState, Policy
from orchestrator.errors import Busy, OrchestratorError, TransportError
from orchestrator.rollout.simulated import SimulatedBox
from orchestrator.testing import FakeClock, FakeRolloutStore
from tests.hosts.wait import wait_for

from .conftest import make_catalog

HOSTS = ["h1", "h2", "h3", "h4"]
MODELS = {"alpha": "org/alpha", "beta": "org/beta"}


def fleet_catalog() -> Catalog:
    hosts = {
        h: {"transport": "ssh", "address": f"127.0.0.{i + 10}", "gpus": 8, "gpu_memory_gib": 96}
        for i, h in enumerate(HOSTS)
    }
    return make_catalog(
        hosts=hosts,
        groups={"inference": {"hosts": HOSTS, "canary": 1, "batch": 2}},
        models={
            "beta": {
                "repo": "org/beta",
                "group": "inference",
                "gpus": [0, 1, 2, 3],
                "tensor_parallel": 4,
                "port": 8001,
                "source": "none",
            }
        },
    )


def world(**box: Any) -> tuple[FleetController, dict[str, SimulatedBox], FakeRolloutStore]:
    boxes = {h: SimulatedBox(h, MODELS, serving="alpha", **box) for h in HOSTS}
    store = FakeRolloutStore()
    catalog = fleet_catalog()
    controller = FleetController(
        lambda: catalog, clock=FakeClock(), pid=4242, store=store, connect=lambda host: boxes[host.name]
    )
    return controller, boxes, store


def run_to_end(controller: FleetController, rid: int) -> dict[str, Any]:
    items = list(controller.follow(rid))
    return dict(items[-1]["result"])


def states(summary: dict[str, Any]) -> dict[str, str]:
    return {h["host"]: h["state"] for h in summary["hosts"]}


def test_rollout_is_recorded_with_who_started_it_and_switches_every_host_once() -> None:
    """Started for alice: the record names her; canary then batches; each box switched to beta once."""
    controller, boxes, _store = world()
    started = controller.start(RolloutStartArgs(model="beta"), "alice@10.0.0.7")
    summary = run_to_end(controller, started["id"])
    assert summary["rollout"]["status"] == "succeeded"
    assert summary["rollout"]["started_by"] == "alice@10.0.0.7"
    assert states(summary) == dict.fromkeys(HOSTS, "switched")
    assert [b.switches("beta") for b in boxes.values()] == [1, 1, 1, 1]


def test_a_finished_rollout_closes_its_connections_to_the_boxes() -> None:
    """The controller lives on after a rollout: the rollout's channels to every box are closed."""
    controller, boxes, _store = world()
    run_to_end(controller, controller.start(RolloutStartArgs(model="beta"), "alice")["id"])
    for t in controller.threads:
        t.join(timeout=30)
    assert all(b.closed for b in boxes.values())


def test_each_batch_is_recorded_ended_before_the_next_batch_switches() -> None:
    """When a box of batch N starts switching, every host of earlier batches is recorded ended."""
    controller, boxes, store = world()
    seen: dict[str, set[str]] = {}

    def on_switch(name: str) -> None:
        records = store.hosts(1)
        mine = next(r.batch for r in records if r.host == name)
        seen[name] = {r.state.value for r in records if r.batch < mine}

    for b in boxes.values():
        b.on_switch = on_switch
    run_to_end(controller, controller.start(RolloutStartArgs(model="beta"), "alice")["id"])
    assert seen == {"h1": set(), "h2": {"switched"}, "h3": {"switched"}, "h4": {"switched"}}


def test_a_second_rollout_on_the_same_group_is_refused_naming_the_first_and_who_started_it() -> None:
    """While #1 holds the group, bob's start exits 5 naming #1 and alice; no box switches for bob."""
    hold = threading.Event()
    controller, boxes, store = world(hold=hold)
    first = controller.start(RolloutStartArgs(model="beta"), "alice@socket")
    try:
        with pytest.raises(Busy) as refused:
            controller.start(RolloutStartArgs(model="beta"), "bob@socket")
    finally:
        hold.set()
    assert refused.value.exit_code == 5
    assert "rollout #1 (beta on group inference, started by alice@socket) is still running" in str(refused.value)
    run_to_end(controller, first["id"])
    assert len(store.rollouts) == 1 and [b.switches("beta") for b in boxes.values()] == [1, 1, 1, 1]


def test_refusing_a_rollout_beside_a_running_one_says_wait_or_abort_not_resume() -> None:
    """The first rollout still runs: the refusal tells to follow or abort it, never to resume what is running."""
    hold = threading.Event()
    controller, _boxes, _store = world(hold=hold)
    first = controller.start(RolloutStartArgs(model="beta"), "alice@socket")
    try:
        with pytest.raises(Busy) as refused:
            controller.start(RolloutStartArgs(model="beta"), "bob@socket")
    finally:
        hold.set()
    assert "rollout resume" not in str(refused.value)
    assert "rollout status --follow" in str(refused.value) and "rollout abort" in str(refused.value)
    run_to_end(controller, first["id"])


def test_a_rollout_refused_beside_one_nothing_drives_says_resume_or_abort() -> None:
    """A rollout recorded running whose controller is gone: the refusal names `resume` or `abort`."""
    controller, _boxes, store = world()
    rid = store.create(
        "beta",
        "inference",
        Policy(canary=1, batch=2),
        "health",
        [("h1",), ("h2", "h3"), ("h4",)],
        pid=1,
        started_by="alice",
    )
    with pytest.raises(Busy) as refused:
        controller.start(RolloutStartArgs(model="beta"), "bob@socket")
    assert f"rollout #{rid} (beta on group inference, started by alice) has not finished" in str(refused.value)
    assert "`orchestrator rollout resume` or `orchestrator rollout abort` first" in str(refused.value)


def test_each_box_records_the_rollouts_switch_as_the_rollout_and_who_started_it() -> None:
    """The controller's switch names its rollout and the operator who started it; a real agent accepts the label."""
    from orchestrator.contract.args import SwitchArgs

    controller, boxes, _store = world()
    run_to_end(controller, controller.start(RolloutStartArgs(model="beta"), "alice@10.0.0.7")["id"])
    [sent] = [a for op, a in zip(boxes["h1"].asked, boxes["h1"].args, strict=True) if op == "switch"]
    assert sent == {"model": "beta", "rollout": "rollout #1 by alice@10.0.0.7"}
    SwitchArgs.model_validate(sent)


def test_abort_from_another_client_stops_before_the_next_batch() -> None:
    """Abort while the canary switches: the canary ends, no other box is switched, the rollout reads aborted."""
    hold = threading.Event()
    controller, boxes, _store = world(hold=hold)
    rid = controller.start(RolloutStartArgs(model="beta"), "alice")["id"]
    answer = controller.abort(None, rollback_all=False)
    assert "stops after its running batch" in answer["message"]
    hold.set()
    summary = run_to_end(controller, rid)
    assert summary["rollout"]["status"] == "aborted"
    assert states(summary) == {"h1": "switched", "h2": "pending", "h3": "pending", "h4": "pending"}
    assert [b.switches("beta") for b in boxes.values()] == [1, 0, 0, 0]


def test_a_restarted_controller_resumes_and_never_switches_a_host_twice() -> None:
    """The record says h1 switched and h2 switching (its box got there); a new controller over the same
    store finishes the rollout: h2 is recorded from its box, h3 and h4 switched, each once."""
    controller, boxes, store = world()
    rid = store.create(
        "beta",
        "inference",
        Policy(canary=1, batch=2),
        "health",
        [("h1",), ("h2", "h3"), ("h4",)],
        pid=1,
        started_by="alice",
    )
    for name in HOSTS:
        store.set_host(rid, name, baseline_id=1)
    for name in ("h1", "h2"):
        boxes[name]._record("beta", "active")
        boxes[name].serving = "beta"
    store.set_host(rid, "h1", state=HostState.SWITCHED, outcome="active")
    store.set_host(rid, "h2", state=HostState.SWITCHING)
    controller.resume_unfinished()
    summary = run_to_end(controller, rid)
    assert summary["rollout"]["status"] == "succeeded" and states(summary) == dict.fromkeys(HOSTS, "switched")
    assert [b.switches("beta") for b in boxes.values()] == [1, 1, 1, 1]


def test_an_unreachable_host_fails_preflight_naming_it_before_any_box_switches() -> None:
    """h3's key is not authorized for the controller: start fails naming h3; nothing is recorded or switched."""
    controller, boxes, store = world()
    boxes["h3"].unreachable = TransportError("host h3: ssh 127.0.0.12:22: authentication failed (publickey)")
    with pytest.raises(OrchestratorError) as refused:
        controller.start(RolloutStartArgs(model="beta"), "alice")
    assert refused.value.exit_code == 4
    assert "rollout refused before anything stopped" in str(refused.value) and "h3: host h3" in str(refused.value)
    assert store.rollouts == {} and all(b.switches("beta") == 0 for b in boxes.values())


def test_status_of_a_rollout_the_controller_drives_reads_running_with_the_agent() -> None:
    """While it runs: status names the controller's agent pid as alive; after, it reads succeeded."""
    hold = threading.Event()
    controller, _boxes, _store = world(hold=hold)
    rid = controller.start(RolloutStartArgs(model="beta"), "alice")["id"]
    shown = controller.summary(rid)["rollout"]
    assert (shown["status"], shown["controller"]) == ("running", {"pid": 4242, "alive": True, "agent": True})
    hold.set()
    assert run_to_end(controller, rid)["rollout"]["status"] == "succeeded"


def test_an_agent_whose_deploy_toml_has_a_group_model_builds_its_loadout() -> None:
    """A controller's deploy.toml (hosts, a group, a group model): the agent's loadout builds, rendering
    no unit for the group model (each box's own agent deploys it)."""
    from orchestrator.agent.loadout import build

    loaded = build(fleet_catalog(), 0.0)
    assert "beta" not in loaded.specs


CLIENT_TOML = """state_dir = "{state}"
[hosts.h1]
address = "127.0.0.10"
[groups.inference]
hosts = ["h1"]
[models.beta]
group = "inference"
repo = "org/beta"
gpus = [0, 1, 2, 3]
tensor_parallel = 4
port = 8001
source = "none"
"""


def test_ctrl_c_in_the_cli_only_detaches_and_the_controller_finishes_the_rollout(tmp_path: Path) -> None:
    """A CLI following a controller's rollout gets SIGINT mid-canary: exit 130 naming how to re-attach;
    the controller's agent still drives the rollout and ends it succeeded."""
    from tests.unit.test_agent_socket import start as start_agent

    hold = threading.Event()
    controller, boxes, _store = world(hold=hold)
    running = start_agent(tmp_path)
    running.agent.controller = controller
    cfg = tmp_path / "laptop.toml"
    cfg.write_text(CLIENT_TOML.format(state=tmp_path / "laptop"))
    cli = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "rollout", "beta", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ORCHESTRATOR_SOCKET": running.path},
    )
    try:
        wait_for(
            lambda: boxes["h1"].running == "switch" or cli.poll() is not None,
            timeout=60,
            what="the canary's switch to start",
        )
        cli.send_signal(signal.SIGINT)
        _out, err = cli.communicate(timeout=60)
        assert cli.returncode == 130, err
        assert "detached from rollout #1: it goes on on the controller" in err
        assert "`orchestrator rollout status --follow --id 1` re-attaches" in err
        assert controller.summary(1)["rollout"]["controller"]["alive"] is True
    finally:
        hold.set()
        running.server.shutdown()
        running.server.server_close()
    assert run_to_end(controller, 1)["rollout"]["status"] == "succeeded"


def test_a_rollout_a_live_cli_drives_reads_running_and_alive_on_the_controller() -> None:
    """Recorded by a CLI that runs it itself (pid 777, alive): the controller reads it running with that
    process alive, not interrupted; it neither resumes nor takes over what that process drives."""
    controller, boxes, store = world()
    controller.alive = lambda pid: pid == 777
    rid = store.create(
        "beta",
        "inference",
        Policy(canary=1, batch=2),
        "health",
        [("h1",), ("h2", "h3"), ("h4",)],
        pid=777,
        started_by="alice (this CLI)",
    )
    shown = controller.summary(rid)["rollout"]
    assert (shown["status"], shown["controller"]) == ("running", {"pid": 777, "alive": True})
    with pytest.raises(Busy, match="still driven by pid 777"):
        controller.resume(rid)
    assert "the controller (pid 777) stops after its running batch" in controller.abort(rid, False)["message"]
    assert all(b.switches("beta") == 0 for b in boxes.values()) and rid not in controller.runs
