"""Beside switches through the engine, on fake ports: a target that fits beside the model it displaces
on the same GPUs starts (or wakes) first, the route moves, and only then the old model sleeps."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.records import Mode
from orchestrator.core.states import Phase

from .conftest import make_catalog
from .test_warm_switch import WarmWorld

ONE_GPU = {"gpus": [0], "sleep": "level1", "served_name": "chat"}


def beside_catalog(small_util: float = 0.3, **extra: Any) -> Any:
    return make_catalog(
        **extra,
        proxy={"enabled": True, "port": 8000},
        hosts={
            "box": {
                "transport": "ssh",
                "address": "127.0.0.9",
                "gpus": 8,
                "gpu_memory_gib": 96,
                "sleep_ram_gib": 100,
                "sleep_residue_gib": 2,
            }
        },
        models={
            "big": {"repo": "org/big", "port": 8001, "gpu_memory_utilization": 0.6, **ONE_GPU},
            "small": {"repo": "org/small", "port": 8002, "gpu_memory_utilization": small_util, **ONE_GPU},
        },
    )


def world(small_util: float = 0.3) -> WarmWorld:
    ww = WarmWorld(beside_catalog(small_util))
    # What each engine holds awake on the fake 97,887 MiB GPU: its share, a little over.
    ww.host.start_mib.update({"vllm-big.service": 59_000, "vllm-small.service": int(97_887 * small_util) + 300})
    return ww


@pytest.fixture
def bw() -> WarmWorld:
    ww = world()
    assert ww.switch("big").phase is Phase.ACTIVE
    ww.host.calls.clear()
    ww.proxy.applied.clear()
    return ww


def test_a_cold_target_that_fits_starts_before_anything_sleeps(bw: WarmWorld) -> None:
    """big -> small on the same GPU, both fit: small starts, the route moves, then big sleeps."""
    dep = bw.switch("small")
    assert dep.phase is Phase.ACTIVE
    assert bw.engine.plan_of(dep).mode is Mode.BESIDE  # type: ignore[union-attr]
    calls = bw.host.calls
    assert calls.index("start vllm-small.service") < calls.index("sleep vllm-big.service level=1 mode=wait")
    assert "stop vllm-big.service" not in calls
    assert not any("model_switching" in c for c in bw.proxy.applied)  # never a 503 gap
    assert bw.states() == {"big": "asleep", "small": "serving"}
    assert [d.model for d in bw.store.serving_set("box")] == ["small"]


def test_a_failed_start_beside_leaves_the_old_model_serving(bw: WarmWorld) -> None:
    """small crashes on start: big was never slept nor stopped and keeps the route."""
    bw.host.behaviours["vllm-small.service"] = "crash"
    dep = bw.switch("small")
    assert dep.phase is Phase.ROLLED_BACK
    assert not any(c.endswith("vllm-big.service") or "sleep vllm-big" in c for c in bw.host.calls)
    assert not any("model_switching" in c for c in bw.proxy.applied)
    assert bw.proxy.routed is not None and ":8001" in bw.proxy.routed and ":8002" not in bw.proxy.routed
    assert [d.model for d in bw.store.serving_set("box")] == ["big"]


def test_a_target_that_does_not_fit_is_a_stop_start() -> None:
    """small at 0.5 beside big at 0.6 does not fit one GPU: today's stop-start, big sleeps first."""
    ww = world(small_util=0.5)
    ww.switch("big")
    ww.host.calls.clear()
    dep = ww.switch("small")
    assert ww.engine.plan_of(dep).mode is Mode.STOP_START  # type: ignore[union-attr]
    assert ww.host.calls.index("sleep vllm-big.service level=1 mode=wait") < ww.host.calls.index(
        "start vllm-small.service"
    )


def test_room_gone_before_staging_aborts_with_nothing_stopped(bw: WarmWorld) -> None:
    """A process takes the room between the plan and the start: aborted, big untouched."""
    dep = bw.engine.plan_switch("small")
    assert dep is not None and bw.engine.plan_of(dep).mode is Mode.BESIDE  # type: ignore[union-attr]
    bw.host.hold([0], 20_000, "python")
    assert bw.engine.run(dep.id).phase is Phase.ABORTED
    assert "start vllm-small.service" not in bw.host.calls and "sleep vllm-big.service" not in " ".join(bw.host.calls)


def test_a_sleeping_target_wakes_beside_before_the_old_one_sleeps(bw: WarmWorld) -> None:
    """big -> small -> big: big is asleep and fits beside small, so it wakes before small sleeps."""
    bw.switch("small")
    bw.host.calls.clear()
    back = bw.switch("big")
    assert back.phase is Phase.ACTIVE
    assert bw.engine.plan_of(back).mode is Mode.BESIDE  # type: ignore[union-attr]
    calls = bw.host.calls
    assert "start vllm-big.service" not in calls
    assert calls.index("wake vllm-big.service") < calls.index("sleep vllm-small.service level=1 mode=wait")
    assert bw.states() == {"big": "serving", "small": "asleep"}


def test_a_wedged_wake_beside_stops_the_target_and_keeps_the_old_serving(bw: WarmWorld) -> None:
    """big wedges on its wake beside small: big stops, small keeps serving and its route."""
    bw.switch("small")
    bw.host.engine_behaviours["vllm-big.service"] = "wedged_wake"
    bw.proxy.applied.clear()
    back = bw.switch("big")
    assert back.phase is Phase.ROLLED_BACK
    assert "vllm-big.service" not in bw.host.active_units()
    assert not any("model_switching" in c for c in bw.proxy.applied)
    assert bw.states()["small"] == "serving"


@pytest.mark.parametrize("stop_at", ["stopping", "freeing", "checking", "routing"])
def test_an_interrupted_beside_switch_resumes_to_the_new_set(bw: WarmWorld, stop_at: str) -> None:
    """Parked before STOP_AT and run again: small serves, routed; big asleep, never stopped."""
    dep = bw.engine.plan_switch("small")
    assert dep is not None

    def park_at(d: Any) -> None:
        if d.phase.value == stop_at:
            bw.engine.park.set()

    bw.engine.before_step = park_at
    assert bw.engine.run(dep.id).phase.value == stop_at
    bw.engine.park.clear()
    bw.engine.before_step = None
    assert bw.engine.run(dep.id).phase is Phase.ACTIVE
    assert bw.states() == {"big": "asleep", "small": "serving"}
    assert "stop vllm-big.service" not in bw.host.calls
    assert bw.proxy.routed is not None and ":8002" in bw.proxy.routed


def explain(ww: WarmWorld, model: str) -> dict[str, Any]:
    from orchestrator.deploy.operations import Operations

    ports = ww.host.ports(ww.catalog.hosts["box"], ww.weights)
    return Operations(ww.catalog, lambda name: ports, store=ww.store, residency=ww.residency).explain(model)


def test_dry_run_says_beside_no_gap_with_the_figures(bw: WarmWorld) -> None:
    """`switch --dry-run small` (and `plan`): beside, no gap, each GPU's MiB."""
    plan = explain(bw, "small")
    assert plan["mode"] == "beside" and plan["displaced"] == ["big"]
    assert plan["reason"].startswith("no gap: small starts beside big on GPU 0")
    assert "59,000 MiB awake (big)" in plan["reason"] and "of 97,887 MiB: fits" in plan["reason"]


def test_dry_run_to_a_sleeper_that_fits_says_it_wakes_beside(bw: WarmWorld) -> None:
    """The target asleep with its unit unchanged and room for both: it wakes beside, no gap."""
    bw.switch("small")
    plan = explain(bw, "big")
    assert plan["mode"] == "beside" and plan["reason"].startswith("no gap: big is asleep and wakes beside small")


def test_progress_says_the_old_engine_serves_until_the_route_moves_then_sleeps(bw: WarmWorld) -> None:
    """The progress lines of a beside switch: nothing stops first; routing says the old one sleeps after."""
    from .test_progress_text import printed

    bw.events.clear()
    bw.switch("small")
    text = printed(bw.events)
    assert "stopping the old unit" not in text
    assert "small: stopping: nothing (beside: the old engine serves until the route moves)" in text
    assert "small: routing: the front proxy moves the route; the old engine drains, then sleeps or stops" in text


def test_history_shows_the_switch_was_beside(bw: WarmWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """`history` marks a beside switch's phases: beside, no gap."""
    from click.testing import CliRunner

    from orchestrator.cli import deploy_cmds
    from orchestrator.deploy.operations import Operations

    bw.switch("small")
    ports = bw.host.ports(bw.catalog.hosts["box"], bw.weights)
    rows = Operations(bw.catalog, lambda name: ports, store=bw.store, residency=bw.residency).history("box")

    class Rows:
        def call(self, *args: Any, **kw: Any) -> Any:
            return rows

    monkeypatch.setattr(deploy_cmds, "backend", lambda *a, **kw: Rows())
    out = CliRunner().invoke(deploy_cmds.history, ["--on", "box"], terminal_width=400).output
    assert out.count("beside, no gap") == 1


def test_rollback_of_a_warm_switch_wakes_the_old_model_beside(tmp_path: Any) -> None:
    """big -> small (big sleeps) then `rollback`: big wakes beside small before small sleeps."""
    from orchestrator.deploy.operations import Operations

    ww = WarmWorld(beside_catalog(state_dir=str(tmp_path)))
    ww.host.start_mib.update({"vllm-big.service": 59_000, "vllm-small.service": 29_700})
    ports = ww.host.ports(ww.catalog.hosts["box"], ww.weights)
    ports.proxy = ww.proxy
    ops = Operations(ww.catalog, lambda name: ports, store=ww.store, residency=ww.residency)
    ops.switch("big")
    ops.switch("small")
    ww.host.calls.clear()
    ww.proxy.applied.clear()
    assert ops.rollback("box")["outcome"] == "active"
    assert ops.history("box", 1)[0]["plan"]["mode"] == "beside"
    calls = ww.host.calls
    assert calls.index("wake vllm-big.service") < calls.index("sleep vllm-small.service level=1 mode=wait")
    assert not any("model_switching" in c for c in ww.proxy.applied)
    assert ww.states() == {"big": "serving", "small": "asleep"}


BESIDE_CRASHES = (
    [("cold", n) for n in range(12)]
    + [("warm", n) for n in range(12)]
    + [
        (case, p)
        for case in ("cold", "warm")
        for p in (
            Phase.STOPPING,
            Phase.FREEING,
            Phase.STARTING,
            Phase.CHECKING,
            Phase.SLEEPING,
            Phase.VERIFYING,
            Phase.WAKING,
            Phase.ROUTING,
        )
    ]
)


@pytest.mark.parametrize(("case", "where"), BESIDE_CRASHES)
def test_the_agent_killed_in_a_beside_switch_converges(tmp_path: Any, case: str, where: int | Phase) -> None:
    """Killed after any engine call of a beside switch (cold: big -> small; warm: back to a sleeping
    big) or as any phase begins, the resumed run ends active: the target serves, the other sleeps,
    the GPU holds the server's engine and a sleeper's residue, and the route names the server."""
    from orchestrator.adapters.residency_store import SqliteResidencyStore
    from orchestrator.adapters.sqlite_store import SqliteStore
    from orchestrator.core.records import Deployment
    from orchestrator.deploy.deployer import Deployer
    from orchestrator.testing import FakeHost, FakeProxy, FakeWeights

    from .test_engine_crash import Crash, CrashingControl

    host = FakeHost(name="box")
    mib = {"vllm-big.service": 59_000, "vllm-small.service": 29_700}
    host.start_mib.update(mib)
    catalog = beside_catalog()
    ports = host.ports(catalog.hosts["box"], FakeWeights())
    proxy = FakeProxy()
    ports.proxy = proxy
    control = CrashingControl(ports.engine_controls["vllm"])
    ports.engine_controls = {"vllm": control}

    def open_engine() -> tuple[Deployer, SqliteStore, SqliteResidencyStore]:
        store = SqliteStore(tmp_path / "state.db", group=None)
        residency = SqliteResidencyStore(tmp_path / "residency.db", group=None)
        return Deployer(catalog, store, lambda name: ports, residency=residency), store, residency

    eng, store, residency = open_engine()
    for model in ("big", "small") if case == "warm" else ("big",):
        done = eng.plan_switch(model)
        assert done is not None and eng.run(done.id).phase is Phase.ACTIVE
    target, other = ("big", "small") if case == "warm" else ("small", "big")
    dep = eng.plan_switch(target)
    assert dep is not None and eng.plan_of(dep).mode is Mode.BESIDE  # type: ignore[union-attr]
    if isinstance(where, int):
        control.left = where
    else:

        def die(d: Deployment) -> None:
            if d.phase is where:
                raise Crash(where.value)

        eng.before_step = die
    try:
        eng.run(dep.id)
    except Crash:
        pass
    control.left = None
    store.close()
    residency.close()

    eng, store, residency = open_engine()
    for unfinished in store.unfinished("box"):
        eng.run(unfinished.id)
    assert store.get(dep.id).phase is Phase.ACTIVE
    assert {m: r.state for m, r in residency.residency("box").items()} == {target: "serving", other: "asleep"}
    assert sorted(m for _, m, _, _ in host.holders.values()) == sorted(
        [host.residue_mib, mib[f"vllm-{target}.service"]]
    )
    port = catalog.models[target].port
    assert proxy.config is not None and f":{port}" in proxy.config
    assert not any("model_switching" in c for c in proxy.applied)
