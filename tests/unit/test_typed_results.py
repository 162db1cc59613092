"""Typed results where callers decide on them: a switch's outcome is a Phase, a residency decision's reasons
name their model and kind (no text parsed back), an agent's error is matched by its type."""

from __future__ import annotations

from orchestrator.contract.wire import error_of, error_reply
from orchestrator.core.records import SwitchResult
from orchestrator.core.residency import Budgets, Resident, Why, decide
from orchestrator.core.resident import State
from orchestrator.core.states import Phase
from orchestrator.errors import Busy, NodeInUse, UsageError
from tests.unit.conftest import World


def test_a_switch_result_reads_its_outcome_as_a_phase(world: World) -> None:
    dep = world.switch("alpha")
    result = SwitchResult.from_dict({"noop": False, **dep.to_dict()})
    assert result.outcome is Phase.ACTIVE and result.ok and result.deployment_id == dep.id
    assert result.revision == dep.revision and result.model == "alpha" and result.host == "box"


def test_a_failed_switch_or_a_stop_is_not_ok_and_says_how_it_ended() -> None:
    rolled = SwitchResult.from_dict(
        {"host": "box", "model": "b", "revision": 2, "outcome": "rolled_back", "error": "checking: no"}
    )
    assert rolled.outcome is Phase.ROLLED_BACK and not rolled.ok and rolled.error == "checking: no"
    stopped = SwitchResult.from_dict({"host": "box", "model": "b", "revision": 2, "outcome": "stopped"})
    assert stopped.outcome is None and stopped.ended == "stopped" and not stopped.ok


def test_a_noop_is_ok_without_an_outcome() -> None:
    noop = SwitchResult.from_dict({"noop": True, "host": "box", "model": "a", "revision": 1, "message": "x"})
    assert noop.ok and noop.outcome is None


def test_residency_reasons_name_their_model_and_kind() -> None:
    """A without sleep mode stops, C (asleep) is evicted for room: each reason is found by model, and a
    model whose name begins another's ("a" and "ab") is not taken for it."""
    budgets = Budgets(gpu_memory_gib=141.0, residue_gib=3.0, ram_gib=100.0)
    d = decide(
        "t",
        [
            Resident("a", (0,), 0.9, None, 13.0, State.SERVING, served_name="a"),
            Resident("ab", (0,), 0.9, "level1", 13.0, State.STOPPED, served_name="ab"),
            Resident("t", (0,), 0.9, "level1", 13.0, State.STOPPED, served_name="t"),
        ],
        budgets,
    )
    assert [(r.model, r.why) for r in d.reasons] == [("a", Why.NO_SLEEP_MODE)]
    assert d.reason("a").startswith("a stops: it has no sleep mode") and d.reason("ab", "none") == "none"
    assert d.to_dict()["reasons"] == [d.reasons[0].text]


def test_an_agents_busy_error_is_matched_by_type() -> None:
    """demand_jobs waits on a busy host by the error's type (NodeInUse is a Busy), not its class name."""
    assert isinstance(error_of(error_reply(NodeInUse("held", host="box"))["error"]), Busy)
    assert isinstance(error_of(error_reply(Busy("held"))["error"]), Busy)
    assert not isinstance(error_of(error_reply(UsageError("no"))["error"]), Busy)
