"""The engine against fake ports: outcomes, rollback, history and idempotent resume."""

from __future__ import annotations

import pytest

from orchestrator.core.states import Phase
from orchestrator.errors import UsageError

from .conftest import World


def test_first_switch_becomes_active(world: World) -> None:
    """A switch on an empty host ends active with the unit running and enabled."""
    dep = world.switch("alpha")
    assert dep.phase is Phase.ACTIVE
    assert world.host.active_units() == ["vllm-alpha.service"]
    assert world.host.units["vllm-alpha.service"].enabled
    assert world.store.serving("box").revision == 1


def test_switch_stops_the_old_model_first(world: World) -> None:
    """A -> B stops A before B starts, and B serves afterwards."""
    world.switch("alpha")
    dep = world.switch("beta")
    assert dep.phase is Phase.ACTIVE
    calls = world.host.calls
    assert calls.index("stop vllm-alpha.service") < calls.index("start vllm-beta.service")
    assert world.host.active_units() == ["vllm-beta.service"]
    assert not world.host.units["vllm-alpha.service"].enabled


def test_health_failure_rolls_back_to_previous(world: World) -> None:
    """B never gets ready: the engine brings A back and records why."""
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "never_ready"
    dep = world.switch("beta")
    assert dep.phase is Phase.ROLLED_BACK
    assert "not ready after its load deadline" in (dep.error or "")
    assert world.host.active_units() == ["vllm-alpha.service"]
    assert world.store.serving("box").model == "alpha"


def test_completion_failure_rolls_back(world: World) -> None:
    """/health 200 with failing completions is not ready."""
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "health_only"
    dep = world.switch("beta")
    assert dep.phase is Phase.ROLLED_BACK
    assert "completions failed" in (dep.error or "")


def test_crash_on_start_rolls_back(world: World) -> None:
    """A unit whose start job fails rolls back with the journal in the error."""
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "crash"
    dep = world.switch("beta")
    assert dep.phase is Phase.ROLLED_BACK
    assert dep.error is not None and "journal" in dep.error


def test_invalid_unit_aborts_before_stopping(world: World) -> None:
    """A unit systemd cannot load is caught while A still serves; the broken file is removed."""
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "bad_unit"
    dep = world.switch("beta")
    assert dep.phase is Phase.ABORTED
    assert "did not load after daemon-reload" in (dep.error or "")
    assert world.host.active_units() == ["vllm-alpha.service"]
    assert "stop vllm-alpha.service" not in world.host.calls
    assert "vllm-beta.service" not in world.host.units


def test_foreign_process_on_gpus_rolls_back_naming_it(world: World) -> None:
    """A process outside our units holding B's GPUs stops the switch with its PID, name and memory."""
    world.switch("gamma")  # on GPUs 4-7: not in the way
    pid = world.host.hold([2], 20_480, "python3")
    dep = world.switch("beta")
    assert dep.phase is Phase.ROLLED_BACK
    assert f"pid {pid} python3 holds 20.0 GiB on GPU 2" in (dep.error or "")


def test_orphans_of_the_old_unit_are_reaped(world: World) -> None:
    """Processes the stopped unit left in its cgroup are killed, then the switch goes on."""
    world.switch("alpha")
    world.host.orphans.add("vllm-alpha.service")
    dep = world.switch("beta")
    assert dep.phase is Phase.ACTIVE
    assert any(c.startswith("kill vllm-alpha.service") for c in world.host.calls)


def test_failed_rollback_ends_failed_with_both_errors(world: World) -> None:
    """When A cannot come back either, the deployment fails and keeps both errors."""
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "never_ready"
    world.host.behaviours["vllm-alpha.service"] = "crash"
    dep = world.switch("beta")
    assert dep.phase is Phase.FAILED
    assert dep.error and dep.rollback_error
    assert world.store.serving("box") is None


def test_no_rollback_flag_leaves_failure(world: World) -> None:
    """--no-rollback ends in failed without touching A."""
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "never_ready"
    dep = world.switch("beta", no_rollback=True)
    assert dep.phase is Phase.FAILED
    assert world.host.calls.count("start vllm-alpha.service") == 1
    assert world.host.active_units() == ["vllm-beta.service"]


def test_policy_without_rollback_leaves_failure() -> None:
    """policy.rollback_on_failure = false works like --no-rollback: failed, recorded, A not restarted."""
    from .conftest import make_catalog

    world = World(make_catalog(policy={"rollback_on_failure": False}))
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "never_ready"
    dep = world.switch("beta")
    assert (dep.phase, dep.no_rollback) == (Phase.FAILED, True)
    assert world.store.get(dep.id).no_rollback
    assert world.host.calls.count("start vllm-alpha.service") == 1
    assert world.host.active_units() == ["vllm-beta.service"]


def test_first_deploy_failure_cannot_roll_back(world: World) -> None:
    """With no previous stable revision a failure is final."""
    world.host.behaviours["vllm-alpha.service"] = "crash"
    dep = world.switch("alpha")
    assert dep.phase is Phase.FAILED


def test_switch_to_serving_model_is_noop(world: World) -> None:
    """The active, healthy, unchanged model is not redeployed."""
    world.switch("alpha")
    assert world.switch("alpha") is None
    assert len(world.store.history("box")) == 1


def test_force_redeploys_serving_model(world: World) -> None:
    """--force (a scheduled redeploy) restarts the same model as a new revision."""
    world.switch("alpha")
    dep = world.switch("alpha", force=True)
    assert dep.phase is Phase.ACTIVE and dep.revision == 2
    assert world.host.calls.count("start vllm-alpha.service") == 2


def test_rollback_returns_to_previous_model(world: World) -> None:
    """After A -> B, rollback deploys A's recorded unit as revision 3."""
    world.switch("alpha")
    world.switch("beta")
    dep = world.engine.run(world.engine.plan_rollback("box").id)
    assert dep.phase is Phase.ACTIVE and dep.model == "alpha" and dep.revision == 3
    assert dep.spec.unit_sha == world.store.by_revision("box", 1).spec.unit_sha


def test_rollback_to_revision_that_never_served_is_refused(world: World) -> None:
    """rollback --to N refuses a revision that did not become active."""
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "never_ready"
    world.switch("beta")
    with pytest.raises(UsageError, match="revision 2 .* never became active"):
        world.engine.plan_rollback("box", 2)


def test_every_phase_is_timed(world: World) -> None:
    """History keeps a duration for each phase a deployment passed through."""
    dep = world.switch("alpha")
    phases = [t.phase for t in dep.timings]
    assert phases == [
        "planned",
        "preflight",
        "staging",
        "stopping",
        "freeing",
        "installing",
        "starting",
        "checking",
        "routing",
    ]
    assert all(t.seconds is not None for t in dep.timings)


@pytest.mark.parametrize(
    "stop_at", ["preflight", "staging", "stopping", "freeing", "installing", "starting", "checking", "routing"]
)
def test_resume_after_interruption_converges(world: World, stop_at: str) -> None:
    """An engine stopped at any phase boundary and run again ends active, with one unit running."""
    world.switch("alpha")
    dep = world.engine.plan_switch("beta")
    assert dep is not None

    def park_at(d: object) -> None:
        if d.phase.value == stop_at:
            world.engine.park.set()

    world.engine.before_step = park_at
    parked = world.engine.run(dep.id)
    assert parked.phase.value == stop_at
    world.engine.park.clear()
    world.engine.before_step = None
    done = world.engine.run(dep.id)
    assert done.phase is Phase.ACTIVE
    assert world.host.active_units() == ["vllm-beta.service"]


def test_smoke_gate_rolls_back_a_slower_revision() -> None:
    """With a gate of 0.8, a revision at half the previous single-stream tok/s is rolled back."""
    from orchestrator.testing import FakeSmoke

    from .conftest import make_catalog

    world = World(make_catalog(policy={"smoke_bench": True, "min_tok_s_ratio": 0.8}))
    smoke = FakeSmoke({"vllm-alpha.service": 80.0, "vllm-beta.service": 40.0})
    world.engine.ports_for("box").smoke = smoke
    assert world.switch("alpha").bench["headline_tok_s"] == 80.0
    dep = world.switch("beta")
    assert dep.phase is Phase.ROLLED_BACK
    assert "single-stream 40.0 tok/s is below 0.8 x 80.0 tok/s of revision 1 (alpha)" in (dep.error or "")
    assert world.host.active_units() == ["vllm-alpha.service"]


def test_active_switch_cleans_weights_keeping_new_and_previous(world: World) -> None:
    """Once B serves, old weights are cleaned by policy, keeping B's and A's (the rollback target)."""
    world.switch("alpha")
    world.switch("beta")
    assert world.weights.kept == [["alpha"], ["alpha", "beta"]]


def test_failed_weight_cleanup_does_not_fail_the_switch(world: World) -> None:
    """Cleanup runs after the switch succeeded: its failure is logged, the outcome stays active."""
    from orchestrator.errors import WeightsError

    def broken(keep: object) -> list[object]:
        raise WeightsError("disk gone", host="box")

    world.weights.cleanup = broken  # type: ignore[method-assign,assignment]
    assert world.switch("alpha").phase is Phase.ACTIVE


def test_rolled_back_switch_does_not_clean_weights(world: World) -> None:
    """Nothing is removed after a failed switch: the operator may want to look at its weights."""
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "never_ready"
    world.switch("beta")
    assert world.weights.kept == [["alpha"]]


def test_switch_between_installed_models_reloads_systemd_once(world: World) -> None:
    """A switch whose unit files are unchanged makes one daemon-reload: disabling the old model and
    enabling the new one share it (each reload re-reads every unit file of the host)."""
    world.switch("alpha")
    world.switch("beta")
    world.switch("alpha")
    before = len(world.host.calls)
    dep = world.switch("beta")
    assert dep.phase is Phase.ACTIVE
    assert world.host.calls[before:].count("daemon-reload") == 1
    assert world.host.units["vllm-beta.service"].enabled
    assert not world.host.units["vllm-alpha.service"].enabled


def test_switch_to_an_enabled_unit_makes_no_daemon_reload(world: World) -> None:
    """Re-switching to the model that serves changes no unit file and no link: no daemon-reload."""
    world.switch("alpha")
    before = len(world.host.calls)
    world.engine.run(world.engine.plan_switch("alpha", force=True).id)
    assert "daemon-reload" not in world.host.calls[before:]
