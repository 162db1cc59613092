"""What a rollout costs each box in requests: one preflight round trip carrying every check, one
switch whose own answer is the gate's, one connection for the whole rollout; every check and its
refusal kept (a box whose agent predates preflight is asked the old way)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.agent.controller import FleetController
from orchestrator.contract.args import RolloutStartArgs
from orchestrator.core.catalog import Host
from orchestrator.errors import OrchestratorError
from orchestrator.rollout.simulated import SimulatedBox
from orchestrator.testing import FakeClock, FakeRolloutStore

from .test_fleet_controller import HOSTS, MODELS, fleet_catalog, run_to_end, states


def started(boxes: dict[str, SimulatedBox]) -> tuple[FleetController, list[str], dict[str, Any]]:
    """A controller over ``boxes`` that records each connect; the rollout of beta run to its end."""
    connects: list[str] = []
    catalog = fleet_catalog()

    def connect(host: Host) -> SimulatedBox:
        connects.append(host.name)
        return boxes[host.name]

    controller = FleetController(
        lambda: catalog, clock=FakeClock(), pid=4242, store=FakeRolloutStore(), connect=connect
    )
    summary = run_to_end(controller, controller.start(RolloutStartArgs(model="beta"), "alice")["id"])
    for t in controller.threads:
        t.join(timeout=30)
    return controller, connects, summary


def test_each_box_is_asked_one_preflight_one_switch_and_the_gate_over_one_connection() -> None:
    """Canary then batches, gate health: each box gets exactly preflight, switch, status, one connect each."""
    boxes = {h: SimulatedBox(h, MODELS, serving="alpha") for h in HOSTS}
    _controller, connects, summary = started(boxes)
    assert summary["rollout"]["status"] == "succeeded"
    assert {h: b.asked for h, b in boxes.items()} == {h: ["preflight", "switch", "status"] for h in HOSTS}
    assert sorted(connects) == HOSTS and all(b.closed for b in boxes.values())


def test_a_box_whose_agent_predates_preflight_is_asked_the_three_questions() -> None:
    """h2's agent answers preflight as unknown: it alone is asked config_show, status, history; the rollout goes on."""
    boxes = {h: SimulatedBox(h, MODELS, serving="alpha", preflight=h != "h2") for h in HOSTS}
    _controller, _connects, summary = started(boxes)
    assert states(summary) == dict.fromkeys(HOSTS, "switched")
    assert boxes["h2"].asked == ["preflight", "config_show", "status", "history", "switch", "status"]
    assert boxes["h1"].asked == ["preflight", "switch", "status"]


def test_the_health_gate_reads_each_box_at_gate_time_not_its_switch_answer() -> None:
    """The canary's switch answers active, then its engine reads unhealthy: the gate fails it and the rollout stops."""
    boxes = {
        h: SimulatedBox(h, MODELS, serving="alpha", sickens=frozenset({"beta"}) if h == "h1" else frozenset())
        for h in HOSTS
    }
    _controller, _connects, summary = started(boxes)
    assert summary["rollout"]["status"] != "succeeded"
    assert states(summary)["h1"] == "failed"
    assert all(b.switches("beta") == 0 for h, b in boxes.items() if h != "h1")


@pytest.mark.parametrize("old", [False, True], ids=["preflight", "predates-preflight"])
@pytest.mark.parametrize(
    ("spoil", "what", "names"),
    [
        (lambda b: setattr(b, "running", "switch"), "a box is busy or did not answer", "h3: busy: switch on h3"),
        (lambda b: b.models.pop("beta"), "the boxes' deploy.toml", "h3: its agent's deploy.toml has no model 'beta'"),
        (
            lambda b: b.models.update(beta="org/other"),
            "the boxes' deploy.toml",
            "h3: its agent's model beta has repo 'org/other', the controller's deploy.toml says 'org/beta'",
        ),
    ],
    ids=["busy", "no-model", "other-repo"],
)
def test_preflight_refusals_name_the_check_and_the_host_either_way(
    spoil: Any, what: str, names: str, old: bool
) -> None:
    """A busy h3, or one whose deploy.toml lacks or differs on the model: refused with the same words
    through preflight as through the three questions; nothing switches."""
    boxes = {h: SimulatedBox(h, MODELS, serving="alpha", preflight=not old) for h in HOSTS}
    spoil(boxes["h3"])
    controller = FleetController(
        fleet_catalog, clock=FakeClock(), pid=4242, store=FakeRolloutStore(), connect=lambda host: boxes[host.name]
    )
    with pytest.raises(OrchestratorError) as refused:
        controller.start(RolloutStartArgs(model="beta"), "alice")
    assert f"rollout refused before anything stopped ({what}): {names}" in str(refused.value)
    assert all(b.switches("beta") == 0 for b in boxes.values())
