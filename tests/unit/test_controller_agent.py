"""A controller's agent owns only its own hosts: the fleet hosts it reaches as the controller (group
hosts over SSH, each owned by its box's agent) are not watched, recovered or counted by it; and an
agent without groups says it is no controller instead of "unknown group"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.controller import FleetController, own_hosts
from orchestrator.agent.daemon import Agent
from orchestrator.contract.args import RolloutIdArgs, RolloutStartArgs
from orchestrator.deploy.operations import Operations
from orchestrator.errors import UsageError
from orchestrator.testing import FakeClock, FakeHost, FakeRolloutStore, FakeStateStore, FakeWeights

from .conftest import make_catalog

FLEET = {
    f"g{i}": {"transport": "ssh", "address": f"127.0.0.{20 + i}", "gpus": 8, "gpu_memory_gib": 96} for i in range(1, 4)
}


class CountingStore(FakeStateStore):
    """The state store in memory, noting each host whose serving record is read."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[str] = set()

    def serving(self, host: str) -> Any:
        self.read.add(host)
        return super().serving(host)


def controller_catalog(tmp_path: Path) -> Any:
    own = {"box": {"transport": "ssh", "address": "127.0.0.9", "gpus": 8, "gpu_memory_gib": 96}}
    models = {
        "alpha": {"repo": "org/alpha", "host": "box", "gpus": [0, 1, 2, 3], "tensor_parallel": 4, "port": 8000},
        "beta": {
            "repo": "org/beta",
            "group": "inference",
            "gpus": [0, 1, 2, 3],
            "tensor_parallel": 4,
            "port": 8001,
            "source": "none",
        },
    }
    return make_catalog(
        state_dir=str(tmp_path / "state"),
        hosts={**own, **FLEET},
        models=models,
        groups={"inference": {"hosts": list(FLEET), "canary": 1, "batch": 2}},
    )


def test_own_hosts_leaves_out_the_group_hosts_reached_over_ssh(tmp_path: Path) -> None:
    """box is in no group: the agent's own; g1-g3 are the fleet's, owned by their agents."""
    assert own_hosts(controller_catalog(tmp_path)) == ["box"]


def test_the_watch_and_the_metrics_of_a_controller_read_only_its_own_hosts(tmp_path: Path) -> None:
    """A watch pass and a metrics refresh read the serving record of box only, never g1-g3."""
    catalog = controller_catalog(tmp_path)
    clock = FakeClock()
    ports = FakeHost(name="box", clock=clock).ports(catalog.hosts["box"], FakeWeights())
    store = CountingStore()
    agent = Agent(
        catalog,
        Operations(catalog, lambda name: ports, store=store),
        socket=str(tmp_path / "agent.sock"),
        metrics_port=None,
        clock=clock,
    )
    agent.watch.tick()
    agent._refresh_metrics()
    assert store.read == {"box"}


@pytest.mark.parametrize("call", ["start", "resume", "abort", "status"])
def test_an_agent_without_groups_says_it_is_no_controller(tmp_path: Path, call: str) -> None:
    """rollout start/resume/abort/status at an agent whose deploy.toml has no groups: exit 2 saying the
    agent is not a fleet controller and how to reach one (not "unknown group")."""
    catalog = make_catalog(state_dir=str(tmp_path / "state"))
    controller = FleetController(lambda: catalog, clock=FakeClock(), pid=4242, store=FakeRolloutStore())
    act = {
        "start": lambda: controller.start(RolloutStartArgs(model="alpha", group="inference"), "alice"),
        "resume": lambda: controller.resume(RolloutIdArgs().id),
        "abort": lambda: controller.abort(None, rollback_all=False),
        "status": lambda: controller.summary(None),
    }[call]
    with pytest.raises(UsageError) as refused:
        act()
    assert refused.value.exit_code == 2
    assert str(refused.value).startswith(
        "the agent (pid 4242) that answered is not a fleet controller: its deploy.toml has no [groups.*]"
    )


def test_a_tune_of_a_fleet_host_at_its_controller_is_refused_naming_the_box_agent(tmp_path: Path) -> None:
    """tune --resume/--status for g1 at the controller: exit 2, g1's own agent runs its tune."""
    from orchestrator.agent.server import Jobs
    from orchestrator.agent.tune_jobs import TuneJobs
    from orchestrator.contract.args import TuneHostArgs

    catalog = controller_catalog(tmp_path)
    ops = Operations(
        catalog, lambda name: FakeHost(name=name).ports(catalog.hosts[name], FakeWeights()), store=FakeStateStore()
    )
    tuner = TuneJobs(Jobs(ops, lambda job: None), lambda: ops, lambda: None)
    for act in (lambda: tuner.status(TuneHostArgs(host="g1")), lambda: list(tuner.resume(TuneHostArgs(host="g1")))):
        with pytest.raises(
            UsageError,
            match=r"host g1 is a group host this agent reaches as its fleet's "
            r"controller: .*`orchestrator --host g1 tune \.\.\.`",
        ):
            act()
    assert tuner.status(TuneHostArgs(host="box"))["run"] is None
