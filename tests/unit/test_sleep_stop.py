"""The one home of taking an engine out of service (deploy/sleep_stop.py) and of a model leaving what
serves (deploy/serving_set.py), on fake ports: each parameter that tells one caller from another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.records import Deployment
from orchestrator.core.states import Phase
from orchestrator.deploy import serving_set
from orchestrator.deploy.context import StepContext
from orchestrator.deploy.sleep_stop import sleep_or_stop, stop_and_free
from orchestrator.errors import GpuBusy
from orchestrator.testing.services import FakeProxy

from .conftest import OpsWorld
from .test_warm_switch import TP4, WarmWorld, warm_catalog

GAMMA = {**TP4, "gpus": [4, 5, 6, 7], "served_name": "other"}


class Box(WarmWorld):
    """gamma, then alpha serving (sleep mode, level1; alpha on GPUs 0-3, the pointer on it), and a
    context of the kind every caller builds."""

    def __init__(self) -> None:
        super().__init__(
            warm_catalog(
                alpha={"repo": "org/alpha", "port": 8001, **TP4}, gamma={"repo": "org/gamma", "port": 8003, **GAMMA}
            )
        )
        assert self.switch("gamma").phase is Phase.ACTIVE and self.switch("alpha").phase is Phase.ACTIVE
        self.alpha: Deployment = next(d for d in self.store.serving_set("box") if d.model == "alpha")
        self.notes: list[dict[str, Any]] = []
        self.shown: list[str] = []
        self.ctx = StepContext(
            ports=self.engine.ports_for("box"),
            catalog=self.catalog,
            progress=lambda e, f: self.shown.append(e),
            record=lambda kind, detail: self.notes.append(detail),
            residency=self.residency,
        )

    @property
    def unit(self) -> str:
        return self.alpha.spec.unit_name

    def active(self) -> bool:
        return self.unit in self.host.active_units()


@pytest.fixture
def box() -> Box:
    return Box()


def test_stop_and_free_stops_waits_for_the_gpus_and_records_it_stopped(box: Box) -> None:
    """The unit stops, its GPUs are read until free, and the residency says stopped."""
    stop_and_free(box.ctx, "alpha", box.unit, (0, 1, 2, 3))
    assert not box.active()
    assert "gpus_free" in box.shown
    assert box.states()["alpha"] == "stopped"


def test_stop_and_free_with_kill_sends_sigkill_before_the_stop(box: Box) -> None:
    """kill: a running engine's cgroup gets SIGKILL first (a wedged engine ignores a polite stop)."""
    stop_and_free(box.ctx, "alpha", box.unit, (0, 1, 2, 3), kill=True)
    calls = [c for c in box.host.calls if box.unit in c]
    assert calls[-2:] == [f"kill {box.unit} 9", f"stop {box.unit}"]


def test_stop_and_free_without_free_does_not_wait_for_the_gpus(box: Box) -> None:
    """free=False: a foreign process on its GPUs does not hold the stop (the caller reads them later)."""
    box.host.hold([0], 50_000, name="intruder")
    stop_and_free(box.ctx, "alpha", box.unit, (0, 1, 2, 3), free=False)
    assert not box.active() and "gpus_free" not in box.shown


def test_stop_and_free_waits_for_a_foreign_process_unless_others_stay(box: Box) -> None:
    """A process of another unit on its GPUs fails the free; with others_stay (a sleeper's stop) it stays."""
    box.host.hold([0], 50_000, name="other-engine", unit="vllm-beta.service")
    with pytest.raises(GpuBusy, match="other-engine"):
        stop_and_free(box.ctx, "alpha", box.unit, (0, 1, 2, 3))
    assert box.states()["alpha"] == "serving"  # a free that fails leaves the record for the retry
    stop_and_free(box.ctx, "alpha", box.unit, (0, 1, 2, 3), others_stay=True)
    assert box.states()["alpha"] == "stopped"


def test_stop_and_free_disables_the_unit_when_asked(box: Box) -> None:
    """disable: the unit does not come back on reboot."""
    assert box.host.units[box.unit].enabled
    stop_and_free(box.ctx, "alpha", box.unit, (0, 1, 2, 3), disable=True)
    assert not box.host.units[box.unit].enabled


def test_stop_and_free_without_mark_leaves_the_residency_to_the_caller(box: Box) -> None:
    """mark_stopped=False: the caller records it (stop: with the serving set, in one place)."""
    stop_and_free(box.ctx, "alpha", box.unit, (0, 1, 2, 3), mark_stopped=False)
    assert not box.active() and box.states()["alpha"] == "serving"


def test_sleep_or_stop_sleeps_and_records_it_asleep_with_a_note(box: Box) -> None:
    """A model with sleep mode sleeps (verified), is recorded asleep, and the note says how long it took."""
    left = sleep_or_stop(box.ctx, box.alpha.spec, sleep=True, weights=12.5)
    assert left.asleep and left.sleep_failed is None
    assert box.active() and box.host.sleeping == {box.unit: 1}
    assert box.residency.residency("box")["alpha"].weights_gib == 12.5
    assert [n["step"] for n in box.notes] == ["slept"] and "seconds" in box.notes[0]


def test_sleep_or_stop_stops_an_engine_whose_sleep_keeps_its_memory(box: Box) -> None:
    """A sleep that keeps the memory stops the engine instead, and says why."""
    box.host.engine_behaviours[box.unit] = "leaky_sleep"
    left = sleep_or_stop(box.ctx, box.alpha.spec, sleep=True)
    assert not left.asleep and left.sleep_failed
    assert not box.active() and box.states()["alpha"] == "stopped"
    assert [n["step"] for n in box.notes] == ["sleep_failed"]


def test_sleep_or_stop_not_asked_to_sleep_stops_and_notes_why(box: Box) -> None:
    """sleep=False: no sleep is tried; the engine stops with the decision's reason in the note."""
    sleep_or_stop(box.ctx, box.alpha.spec, sleep=False, why="no room in host RAM")
    assert not box.active() and f"sleep {box.unit} level=1 mode=wait" not in box.host.calls
    assert box.notes == [{"step": "stopping", "model": "alpha", "reason": "no room in host RAM"}]


def test_sleep_or_stop_without_notes_records_and_shows_none(box: Box) -> None:
    """notes=False (the agent's idle job records its own event): no warm note, no progress line of one."""
    sleep_or_stop(box.ctx, box.alpha.spec, sleep=True, notes=False)
    assert box.host.sleeping == {box.unit: 1}
    assert box.notes == [] and "slept" not in box.shown


def test_leave_clears_the_pointer_naming_it_and_keeps_the_rest_of_the_set(box: Box) -> None:
    """A model that leaves what serves: the pointer named it, so it is cleared; the set keeps the others."""
    serving_set.leave(box.store, "box", box.alpha.revision, in_set=True)
    assert box.store.serving("box") is None
    assert [d.model for d in box.store.serving_set("box")] == ["gamma"]


def test_leave_keeps_a_pointer_that_names_another_revision(box: Box) -> None:
    """The pointer is cleared only where it named the revision that leaves."""
    serving_set.leave(box.store, "box", box.alpha.revision + 100, in_set=False)
    serving = box.store.serving("box")
    assert serving is not None and serving.revision == box.alpha.revision


def test_stop_serving_takes_the_model_out_of_the_proxy(tmp_path: Path) -> None:
    """[proxy] on: tune's restore of a host nothing served before stops the model, empties the serving set
    and leaves the proxy routing nothing to it (it answered 502 from a stopped engine before)."""
    w = OpsWorld(tmp_path / "state", proxy={"enabled": True, "port": 9000})
    proxy = FakeProxy()
    w.ops.ports_for("box").proxy = proxy
    assert w.ops.switch("alpha")["outcome"] == "active"
    assert proxy.routed is not None and ":8000" in (proxy.routed or "")
    w.ops.stop_serving("box", reason="tune:1:restore")
    assert w.store.serving("box") is None and w.store.serving_set("box") == []
    assert ":8000" not in (proxy.routed or "")
