"""Warm switches through the engine, on fake ports: models sleep instead of stopping, wake instead of
starting, and every failure (wedged wake, a sleep that keeps memory, no RAM) ends in a known state."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.records import ServingChange
from orchestrator.core.states import Phase
from orchestrator.deploy.deployer import Deployer
from orchestrator.testing import FakeProxy, FakeResidencyStore, live_config

from .conftest import World, make_catalog

TP4 = {"tensor_parallel": 4, "gpus": [0, 1, 2, 3], "sleep": "level1", "served_name": "chat"}


def warm_catalog(sleep_ram_gib: float = 100, **models: Any) -> Any:
    return make_catalog(
        proxy={"enabled": True, "port": 8000},
        hosts={
            "box": {
                "transport": "ssh",
                "address": "127.0.0.9",
                "gpus": 8,
                "gpu_memory_gib": 96,
                "sleep_ram_gib": sleep_ram_gib,
                "sleep_residue_gib": 2,
            }
        },
        models=models
        or {"alpha": {"repo": "org/alpha", "port": 8001, **TP4}, "beta": {"repo": "org/beta", "port": 8002, **TP4}},
    )


class WarmWorld(World):
    def __init__(self, catalog: Any | None = None) -> None:
        super().__init__(catalog or warm_catalog())
        self.proxy = FakeProxy()
        self.residency = FakeResidencyStore()
        ports = self.host.ports(self.catalog.hosts["box"], self.weights)
        ports.proxy = self.proxy
        self.engine = Deployer(
            self.catalog,
            self.store,
            lambda name: ports,
            residency=self.residency,
            progress=lambda e, f: self.events.append((e, f)),
        )

    def states(self) -> dict[str, str]:
        return {m: r.state for m, r in self.residency.residency("box").items()}

    def phases(self, dep_id: int) -> list[str]:
        return [t.phase for t in self.store.get(dep_id).timings]

    def warm_events(self) -> list[dict[str, Any]]:
        return [e for e in self.store.events(kind="warm", limit=500)]


@pytest.fixture
def ww() -> WarmWorld:
    return WarmWorld()


def test_switching_back_to_a_sleeper_is_warm(ww: WarmWorld) -> None:
    """alpha -> beta -> alpha: alpha sleeps when beta comes, and the second alpha wakes, not starts."""
    assert ww.switch("alpha").phase is Phase.ACTIVE
    assert ww.switch("beta").phase is Phase.ACTIVE
    assert ww.states() == {"alpha": "asleep", "beta": "serving"}
    ww.host.calls.clear()
    back = ww.switch("alpha")
    assert back.phase is Phase.ACTIVE
    assert ww.phases(back.id)[-4:] == ["sleeping", "verifying", "waking", "routing"]
    assert "start vllm-alpha.service" not in ww.host.calls and "wake vllm-alpha.service" in ww.host.calls
    assert ww.states() == {"alpha": "serving", "beta": "asleep"}
    assert [d.model for d in ww.store.serving_set("box")] == ["alpha"]


def test_the_displaced_engine_sleeps_with_mode_wait_after_the_route_moved(ww: WarmWorld) -> None:
    """A warm swap routes to the target first, then sleeps the displaced engine with mode=wait."""
    ww.switch("alpha")
    ww.switch("beta")
    ww.proxy.applied.clear()
    ww.host.calls.clear()
    ww.switch("alpha")
    assert "sleep vllm-beta.service level=1 mode=wait" in ww.host.calls
    assert ww.proxy.applied and ":8001" in live_config(ww.proxy.applied[0])
    assert ":8002" not in live_config(ww.proxy.applied[0])
    assert not any("model_switching" in c for c in ww.proxy.applied)  # never a 503 gap in a warm swap


def test_what_happens_to_the_displaced_model_is_decided_before_the_route_moves(ww: WarmWorld) -> None:
    """Staging decides and persists the displaced models' fate (weights measured then): between the
    route move and the wake the switch only acts, it measures nothing."""
    ww.switch("alpha")
    ww.switch("beta")
    ww.host.calls.clear()
    back = ww.switch("alpha")
    fate = [e for e in ww.warm_events() if e.get("step") == "fate" and e["deployment_id"] == back.id]
    assert [(f["phase"], f["sleep"]) for f in fate] == [("staging", ["beta"])]
    window = ww.host.calls[ww.host.calls.index("sleep vllm-beta.service level=1 mode=wait") :]
    assert not [c for c in window if c.startswith("du ")]


def test_the_drain_of_the_displaced_engines_is_kept_with_the_deployment(ww: WarmWorld) -> None:
    """The sleeping step records how long the displaced engines took to finish what they served, so a
    warm switch's gap can be split into theirs and the switch's."""
    ww.switch("alpha")
    ww.switch("beta")
    back = ww.switch("alpha")
    drained = [e for e in ww.warm_events() if e.get("step") == "drained" and e["deployment_id"] == back.id]
    assert [(d["phase"], d["seconds"] >= 0) for d in drained] == [("sleeping", True)]


def test_the_window_reads_no_cgroup_staging_read_them(ww: WarmWorld) -> None:
    """From the route move to the woken target the switch reuses the PIDs staging read: no unit's
    cgroup is read between `sleeping` and `routing`."""
    ww.switch("alpha")
    ww.switch("beta")
    marks: dict[str, int] = {}

    def mark(dep: Any) -> None:
        marks.setdefault(dep.phase.value, len(ww.host.reads))

    ww.engine.before_step = mark
    assert ww.switch("alpha").phase is Phase.ACTIVE
    assert marks["staging"] < marks["sleeping"] and ww.host.reads[marks["staging"] : marks["sleeping"]]
    assert ww.host.reads[marks["sleeping"] : marks["routing"]] == []


def test_wedged_wake_is_restarted_cold_and_the_switch_ends_active(ww: WarmWorld) -> None:
    """A wake that fails with the engine's 500 restarts the unit cold; the switch still ends active,
    with vLLM's words in the deployment's error and the restart in its events."""
    ww.switch("alpha")
    ww.switch("beta")
    ww.host.engine_behaviours["vllm-alpha.service"] = "wedged_wake"
    ww.host.calls.clear()
    back = ww.switch("alpha")
    assert back.phase is Phase.ACTIVE
    assert "restarting" in ww.phases(back.id) and "checking" in ww.phases(back.id)
    assert back.error is not None and "CUDA Error: out of memory" in back.error
    assert any(c.startswith("kill vllm-alpha.service 9") for c in ww.host.calls)
    assert any(e["step"] == "restart_wedged" for e in ww.warm_events())
    assert ww.states() == {"alpha": "serving", "beta": "asleep"}


def test_a_sleep_that_keeps_its_memory_stops_that_engine(ww: WarmWorld) -> None:
    """beta answers its sleep but keeps its memory: it is stopped instead, recorded with the PID and
    MiB, and alpha still wakes."""
    ww.switch("alpha")
    ww.switch("beta")
    ww.host.engine_behaviours["vllm-beta.service"] = "leaky_sleep"
    back = ww.switch("alpha")
    assert back.phase is Phase.ACTIVE
    failed = [e for e in ww.warm_events() if e["step"] == "sleep_failed"]
    assert failed and failed[0]["model"] == "beta" and "holds 70000 MiB on GPU 0" in failed[0]["error"]
    assert ww.states() == {"alpha": "serving", "beta": "stopped"}
    assert "vllm-beta.service" not in ww.host.active_units()


def test_ram_budget_full_evicts_the_least_recently_served_sleeper() -> None:
    """With room in host RAM for one sleeper, the third model's switch stops the oldest sleeper."""
    models = {name: {"repo": f"org/{name}", "port": 8001 + i, **TP4} for i, name in enumerate(("a", "b", "c"))}
    ww = WarmWorld(warm_catalog(sleep_ram_gib=1.5, **models))
    for name in models:
        ww.host.sizes[ww.engine.spec_for(ww.catalog.models[name]).model_dir] = 2**30  # 1 GiB of weights each
    ww.switch("a")
    ww.switch("b")
    assert ww.states() == {"a": "asleep", "b": "serving"}
    assert ww.switch("c").phase is Phase.ACTIVE
    assert ww.states() == {"a": "stopped", "b": "asleep", "c": "serving"}
    evicted = [e for e in ww.warm_events() if e["step"] == "evicted"]
    assert [e["model"] for e in evicted] == ["a"]


def test_rollback_of_a_warm_switch_is_warm(ww: WarmWorld) -> None:
    """alpha's wake wedges and its cold restart fails: beta, asleep, is woken back (not started),
    and alpha is stopped."""
    ww.switch("alpha")
    ww.switch("beta")
    ww.host.engine_behaviours["vllm-alpha.service"] = "wedged_wake"
    ww.host.behaviours["vllm-alpha.service"] = "crash"
    ww.host.calls.clear()
    back = ww.switch("alpha")
    assert back.phase is Phase.ROLLED_BACK
    assert "start vllm-beta.service" not in ww.host.calls and "wake vllm-beta.service" in ww.host.calls
    assert ww.states() == {"alpha": "stopped", "beta": "serving"}
    assert [d.model for d in ww.store.serving_set("box")] == ["beta"]


def test_a_sleeping_engine_is_not_healthy(ww: WarmWorld) -> None:
    """/health is 200 while asleep; is_healthy reads /is_sleeping and says no."""
    ww.switch("alpha")
    dep = ww.store.serving_set("box")[0]
    assert ww.engine.is_healthy(dep)
    control = ww.host.ports().engine_control_for(dep.spec)
    assert control is not None
    control.sleep(dep.spec.base_url, 1)
    assert not ww.engine.is_healthy(dep)


def test_a_model_without_sleep_mode_stops_as_before() -> None:
    """Without `sleep` the displaced model stops and the next switch to it is a cold start."""
    plain = {k: v for k, v in TP4.items() if k != "sleep"}
    ww = WarmWorld(
        warm_catalog(
            alpha={"repo": "org/alpha", "port": 8001, **plain}, beta={"repo": "org/beta", "port": 8002, **plain}
        )
    )
    ww.switch("alpha")
    ww.switch("beta")
    assert "vllm-alpha.service" not in ww.host.active_units()
    back = ww.switch("alpha")
    assert back.phase is Phase.ACTIVE and "waking" not in ww.phases(back.id)


def test_status_shows_residency_ram_and_gpu_memory_by_process(tmp_path: Any) -> None:
    """`status` (its data and its text) says who serves and who sleeps, the host RAM sleepers hold,
    and each GPU's memory by PID with the model and state it belongs to."""
    import io

    from rich.console import Console

    from orchestrator.cli.deploy_cmds import print_status
    from orchestrator.deploy.operations import Operations

    ww = WarmWorld(warm_catalog().model_copy(update={"state_dir": str(tmp_path)}))
    ww.host.sizes[ww.engine.spec_for(ww.catalog.models["alpha"]).model_dir] = 3 * 2**30
    ports = ww.host.ports(ww.catalog.hosts["box"], ww.weights)
    ports.proxy = ww.proxy
    ops = Operations(ww.catalog, lambda name: ports, store=ww.store, residency=ww.residency)
    ops.switch("alpha")
    ops.switch("beta")
    res = ops.status("box")["hosts"]["box"]["residency"]
    assert [(m["model"], m["state"], m["level"]) for m in res["models"]] == [
        ("alpha", "asleep", "level1"),
        ("beta", "serving", None),
    ]
    assert res["sleep_ram_gib"] == 3.0 and res["ram_budget_gib"] == 100
    gpu0 = res["gpus"][0]["processes"]
    assert sorted((p["model"], p["state"], p["mib"]) for p in gpu0) == [
        ("alpha", "asleep", 1_800),
        ("beta", "serving", 70_000),
    ]
    out = io.StringIO()
    print_status(Console(file=out, width=200), ops.status("box"))
    text = out.getvalue()
    assert "asleep alpha (level1, 3.00 GiB of host RAM)" in text and "serving beta" in text
    assert "sleepers hold 3.00 GiB of host RAM (budget 100.0 GiB)" in text
    assert "alpha asleep 1800 MiB" in text and "beta serving 70000 MiB" in text


def test_a_model_stopped_behind_the_records_back_does_not_block_a_sleep() -> None:
    """A third model recorded serving on the same GPUs but stopped since (systemctl stop) holds nothing:
    the displaced model still sleeps."""
    models = {name: {"repo": f"org/{name}", "port": 8001 + i, **TP4} for i, name in enumerate(("a", "b", "c"))}
    ww = WarmWorld(warm_catalog(**models))
    ww.switch("c")
    ww.host.ports().systemd.stop("vllm-c.service")  # stopped outside a switch: the residency still says serving
    ww.store.move_serving(ServingChange(sets=(("box", ()),)))
    ww.switch("a")
    ww.switch("b")
    assert ww.states()["a"] == "asleep"


def test_stop_beside_a_sleeper_leaves_its_residue_alone(tmp_path: Any) -> None:
    """`stop` of the serving model waits for its own memory only: a sleeper's residue on the same
    GPUs is not a busy GPU, and the sleeper stays asleep."""
    from orchestrator.deploy.operations import Operations

    ww = WarmWorld(warm_catalog().model_copy(update={"state_dir": str(tmp_path)}))
    ports = ww.host.ports(ww.catalog.hosts["box"], ww.weights)
    ports.proxy = ww.proxy
    ops = Operations(ww.catalog, lambda name: ports, store=ww.store, residency=ww.residency)
    ops.switch("alpha")
    ops.switch("beta")
    assert ops.stop("beta")["outcome"] == "stopped"
    assert ww.states() == {"alpha": "asleep", "beta": "stopped"}


def test_status_calls_a_sleeper_whose_unit_stopped_stopped(tmp_path: Any) -> None:
    """A sleeper's unit stopped outside the product (a reboot, systemctl): probed, status says stopped."""
    from orchestrator.deploy.operations import Operations

    ww = WarmWorld(warm_catalog().model_copy(update={"state_dir": str(tmp_path)}))
    ports = ww.host.ports(ww.catalog.hosts["box"], ww.weights)
    ports.proxy = ww.proxy
    ops = Operations(ww.catalog, lambda name: ports, store=ww.store, residency=ww.residency)
    ops.switch("alpha")
    ops.switch("beta")
    ww.host.ports().systemd.stop("vllm-alpha.service")
    states = {m["model"]: m["state"] for m in ops.status("box")["hosts"]["box"]["residency"]["models"]}
    assert states == {"alpha": "stopped", "beta": "serving"}


def test_a_target_left_asleep_by_a_rollback_answers_what_it_held_first(ww: WarmWorld) -> None:
    """beta's wake is refused (a foreign process holds the GPU) and the switch rolls back: beta was
    routed to since `sleeping`, so it is woken and put back to sleep before alpha wakes again."""
    from orchestrator.core.records import Deployment

    ww.switch("alpha")
    ww.switch("beta")
    ww.switch("alpha")  # alpha serves, beta sleeps
    foreign: list[int] = []

    def hook(dep: Deployment) -> None:
        if dep.phase is Phase.VERIFYING and not foreign:
            foreign.append(ww.host.hold([0], 90_000, "python"))
        if dep.phase is Phase.ROLLING_BACK and foreign:
            ww.host.holders.pop(foreign[0], None)

    ww.engine.before_step = hook
    ww.host.calls.clear()
    assert ww.switch("beta").phase is Phase.ROLLED_BACK
    beta = [c for c in ww.host.calls if "vllm-beta" in c and c.startswith(("wake", "sleep"))]
    assert beta == ["wake vllm-beta.service", "sleep vllm-beta.service level=1 mode=wait"]
    assert ww.states() == {"alpha": "serving", "beta": "asleep"}


def test_explain_lists_the_recorded_sleepers_least_recently_served_first() -> None:
    """What `plan` reads from the records: after a, b, c, the sleepers come oldest first (a before b)."""
    from orchestrator.deploy.operations import Operations

    models = {name: {"repo": f"org/{name}", "port": 8001 + i, **TP4} for i, name in enumerate(("a", "b", "c"))}
    ww = WarmWorld(warm_catalog(**models))
    for name in models:
        ww.switch(name)
    ports = ww.host.ports(ww.catalog.hosts["box"], ww.weights)
    ops = Operations(ww.catalog, lambda name: ports, store=ww.store, residency=ww.residency)
    asleep = ops.explain("a")["asleep"]
    assert [(s["model"], s["state"]) for s in asleep] == [("a", "asleep"), ("b", "asleep")]
    assert asleep[0]["last_served"] <= asleep[1]["last_served"]


def test_stop_of_a_sleeper_stops_its_unit_frees_its_gpus_and_records_it(tmp_path: Any) -> None:
    """`stop alpha` while alpha sleeps (not "nothing to stop"): its unit stops, no process of it is left
    on its GPUs (its host RAM goes with it), it reads stopped, and the stop is recorded."""
    from orchestrator.deploy.operations import Operations

    ww = WarmWorld(warm_catalog().model_copy(update={"state_dir": str(tmp_path)}))
    ports = ww.host.ports(ww.catalog.hosts["box"], ww.weights)
    ports.proxy = ww.proxy
    ops = Operations(ww.catalog, lambda name: ports, store=ww.store, residency=ww.residency)
    ops.switch("alpha")
    ops.switch("beta")
    assert "vllm-alpha.service" in {h[3] for h in ww.host.holders.values()}  # its residue
    result = ops.stop("alpha")
    assert (result["outcome"], result["was"], result["serving"]) == ("stopped", "asleep", ["beta"])
    assert ww.host.active_units() == ["vllm-beta.service"]
    assert {h[3] for h in ww.host.holders.values()} == {"vllm-beta.service"}
    assert ww.states() == {"alpha": "stopped", "beta": "serving"}
    assert {k: ww.store.events(kind="stop")[0][k] for k in ("model", "was")} == {"model": "alpha", "was": "asleep"}


def test_dry_run_of_a_switch_to_a_sleeper_says_warm_not_stop_start() -> None:
    """`switch --dry-run` to a model asleep with its unit unchanged describes the warm swap: no 503 gap."""
    from orchestrator.deploy.operations import Operations

    ww = WarmWorld()
    ww.switch("alpha")
    ww.switch("beta")
    ports = ww.host.ports(ww.catalog.hosts["box"], ww.weights)
    plan = Operations(ww.catalog, lambda name: ports, store=ww.store, residency=ww.residency).explain("alpha")
    assert plan["mode"] == "warm" and plan["displaced"] == ["beta"]
    assert "stop-start" not in plan["reason"] and "holds what arrives until it wakes" in plan["reason"]


def test_a_level1_sleeper_under_its_own_unit_is_woken_without_staging_its_weights(ww: WarmWorld) -> None:
    """Back to alpha, asleep at level 1 under the same unit: its weights are in host RAM as it loaded them,
    so the switch wakes it without staging (verifying) them again."""
    ww.switch("alpha")
    ww.switch("beta")
    ww.weights.staged.clear()
    assert ww.switch("alpha").phase is Phase.ACTIVE
    assert ww.weights.staged == []
    assert any(e == "weights_in_ram" for e, _ in ww.events)


def test_a_level2_sleeper_stages_its_weights_before_its_wake() -> None:
    """Level 2 reloads its weights from disk on the wake: they are staged and verified first, as before."""
    level2 = {**TP4, "sleep": "level2"}
    w = WarmWorld(
        warm_catalog(
            alpha={"repo": "org/alpha", "port": 8001, **level2}, beta={"repo": "org/beta", "port": 8002, **level2}
        )
    )
    w.switch("alpha")
    w.switch("beta")
    w.weights.staged.clear()
    assert w.switch("alpha").phase is Phase.ACTIVE
    assert w.weights.staged == ["alpha"]


def test_the_wake_of_a_level1_sleeper_under_its_own_unit_skips_the_start_checks(
    ww: WarmWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its engine loaded with this unit and holds its port: preflight neither probes access nor the
    layout nor the port (a cold switch does, and a level-2 wake, which reads the weights again, too)."""
    from orchestrator.deploy import steps

    checked: list[str] = []
    for name in ("check_access", "check_layout", "port_holder"):
        monkeypatch.setattr(steps, name, lambda *a, _n=name, **k: checked.append(_n))
    ww.switch("alpha")
    assert set(checked) == {"check_access", "check_layout", "port_holder"}
    ww.switch("beta")
    checked.clear()
    assert ww.switch("alpha").phase is Phase.ACTIVE
    assert checked == []


def test_a_displaced_engines_weights_are_measured_once_per_engine_process(ww: WarmWorld) -> None:
    """du of the displaced model's folder runs the first time its engine is put to sleep, not again while
    the same process runs (it holds what it loaded); an engine started again is measured again."""
    for name in ("alpha", "beta"):
        ww.host.sizes[ww.engine.spec_for(ww.catalog.models[name]).model_dir] = 2**30
    ww.switch("alpha")
    ww.switch("beta")
    ww.switch("alpha")
    ww.host.calls.clear()
    ww.switch("beta")
    ww.switch("alpha")
    assert [c for c in ww.host.calls if c.startswith("du ")] == []
    ww.host.units["vllm-alpha.service"].started_at -= 60  # as if started again: another process
    ww.host.calls.clear()
    ww.switch("beta")
    assert [c for c in ww.host.calls if c.startswith("du ")] != []
