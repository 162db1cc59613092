"""core.residency.decide: what a switch sleeps, stops and evicts, and whether the target then fits,
on fake hosts of 141 GiB GPUs with a 3 GiB residue per sleeper."""

from __future__ import annotations

import pytest

from orchestrator.core.residency import Budgets, Resident, decide
from orchestrator.core.resident import State

H200 = Budgets(gpu_memory_gib=141.0, residue_gib=3.0, ram_gib=100.0)


def r(
    name: str,
    state: State = State.STOPPED,
    *,
    gpus: tuple[int, ...] = (0,),
    util: float = 0.9,
    sleep: str | None = "level1",
    weights: float = 13.0,
    served: float | None = None,
) -> Resident:
    level = sleep if state is State.ASLEEP else None
    return Resident(
        name=name,
        gpus=gpus,
        gpu_memory_utilization=util,
        sleep=sleep,
        weights_gib=weights,
        state=state,
        level=level,
        last_served=served,
        served_name=name,
    )


def test_switch_to_a_sleeper_sleeps_the_displaced_and_wakes_it() -> None:
    """A serving, B asleep on the same GPU: A sleeps, B wakes, nothing stops."""
    d = decide("b", [r("a", State.SERVING, served=200), r("b", State.ASLEEP, served=100)], H200)
    assert (d.wake, d.sleep, d.stop, d.evict, d.fits) == (True, ("a",), (), (), True)
    assert d.ram_gib == 13.0 and d.gpu_gib == {0: 3.0}


def test_a_model_without_sleep_mode_stops() -> None:
    """The displaced model has no `sleep`: it stops, and the target cold-starts."""
    d = decide("b", [r("a", State.SERVING, sleep=None), r("b")], H200)
    assert (d.wake, d.sleep, d.stop, d.fits) == (False, (), ("a",), True)
    assert "models.a.sleep" in d.reasons[0].text


def test_a_full_ram_budget_evicts_the_least_recently_served_sleeper() -> None:
    """60 + 30 GiB asleep, A (30 GiB) must sleep in 100 GiB: the older sleeper (C) is evicted."""
    d = decide(
        "t",
        [
            r("a", State.SERVING, weights=30, served=300),
            r("c", State.ASLEEP, weights=30, served=100, gpus=(1,)),
            r("e", State.ASLEEP, weights=60, served=200, gpus=(2,)),
            r("t"),
        ],
        H200,
    )
    assert (d.sleep, d.evict, d.stop) == (("a",), ("c",), ())
    assert d.ram_gib == 90.0
    assert any("c (asleep, the least recently served) is evicted" in x.text for x in d.reasons)


def test_a_never_served_sleeper_counts_as_the_oldest() -> None:
    """last_served None is evicted before any served sleeper."""
    d = decide(
        "t",
        [
            r("a", State.SERVING, weights=50, served=300),
            r("c", State.ASLEEP, weights=50, served=5, gpus=(1,)),
            r("n", State.ASLEEP, weights=50, gpus=(2,)),
            r("t"),
        ],
        H200,
    )
    assert d.evict == ("n",)


def test_weights_larger_than_the_budget_stop_instead_of_sleeping() -> None:
    """A 120 GiB level1 model in a 100 GiB budget stops; the sleepers already there stay."""
    d = decide("t", [r("a", State.SERVING, weights=120), r("c", State.ASLEEP, weights=10, gpus=(1,)), r("t")], H200)
    assert (d.sleep, d.stop, d.evict) == ((), ("a",), ())


def test_level2_sleepers_hold_no_host_ram() -> None:
    """level2 drops the weights: it sleeps whatever the RAM budget."""
    d = decide("t", [r("a", State.SERVING, sleep="level2", weights=500), r("t")], Budgets(141.0, 3.0, ram_gib=0.0))
    assert (d.sleep, d.stop, d.ram_gib) == (("a",), (), 0.0)


def test_an_unknown_ram_budget_allows_only_level2() -> None:
    """No memory_gib, no sleep_ram_gib, not probed: a level1 model stops instead of sleeping."""
    d = decide("t", [r("a", State.SERVING), r("t")], Budgets(141.0, 3.0, ram_gib=None))
    assert d.stop == ("a",) and "unknown" in d.reasons[0].text


def test_residue_is_counted_and_a_sleeper_is_evicted_when_the_wake_would_not_fit() -> None:
    """Target at 0.97 (136.8 GiB) beside two sleepers' 6 GiB on GPU 0: the older sleeper goes."""
    d = decide(
        "t",
        [
            r("x", State.ASLEEP, sleep="level2", served=1),
            r("y", State.ASLEEP, sleep="level2", served=2),
            r("t", State.ASLEEP, util=0.97),
        ],
        H200,
    )
    assert (d.wake, d.evict, d.fits) == (True, ("x",), True)
    assert d.gpu_gib == {0: 3.0}


def test_the_new_sleeper_stops_when_no_older_sleeper_can_make_room() -> None:
    """The displaced model's own residue would not leave the target room: it stops instead."""
    d = decide("t", [r("a", State.SERVING, sleep="level2"), r("t", util=0.99)], H200)
    assert (d.sleep, d.stop, d.fits) == ((), ("a",), True)


def test_co_resident_serving_engines_on_other_gpus_stay() -> None:
    """A model serving on GPU 1 is neither displaced nor counted on GPU 0."""
    d = decide("t", [r("a", State.SERVING, gpus=(1,)), r("t")], H200)
    assert (d.sleep, d.stop, d.evict, d.fits, d.gpu_gib) == ((), (), (), True, {0: 0.0})


def test_a_holder_of_the_target_name_on_other_gpus_is_displaced() -> None:
    """Same served name on disjoint GPUs (a handover): the old holder sleeps once the route moves."""
    a = Resident("a", (1,), 0.9, "level1", 13.0, State.SERVING, None, 5.0, served_name="chat")
    t = Resident("t", (0,), 0.9, "level1", 13.0, State.STOPPED, None, None, served_name="chat")
    assert decide("t", [a, t], H200).sleep == ("a",)


def test_an_explicit_displaced_list_is_used_as_given() -> None:
    """The switch passes plan_switch's displaced set: only those sleep or stop."""
    d = decide(
        "t", [r("a", State.SERVING), r("b", State.SERVING, sleep=None, gpus=(1,)), r("t")], H200, displaced=["a"]
    )
    assert (d.sleep, d.stop) == (("a",), ())


def test_a_target_that_is_serving_changes_nothing() -> None:
    """Switching to what serves: no sleep, stop or eviction."""
    d = decide("a", [r("a", State.SERVING), r("b", State.ASLEEP)], H200)
    assert (d.wake, d.sleep, d.stop, d.evict, d.fits) == (False, (), (), (), True)


def test_an_unknown_target_is_refused() -> None:
    """The target must be one of the host's models."""
    with pytest.raises(ValueError, match="'zz' is not one of the host's models"):
        decide("zz", [r("a")], H200)


def test_a_stuck_serving_engine_on_the_target_gpus_is_reported() -> None:
    """An engine kept by the caller's displaced list on a target GPU:
    the target does not fit, and the reason names it."""
    d = decide("t", [r("a", State.SERVING, util=0.5), r("t", util=0.6)], H200, displaced=[])
    assert not d.fits and "GPU 0 keeps 70.5 GiB (a)" in d.reasons[-1].text


def test_the_decision_serialises_for_plan_json() -> None:
    """to_dict carries every field with GPU indices as strings."""
    d = decide("b", [r("a", State.SERVING), r("b", State.ASLEEP)], H200).to_dict()
    assert d["sleep"] == ["a"] and d["gpu_gib"] == {"0": 3.0} and d["ram_budget_gib"] == 100.0


def test_an_eviction_names_when_the_sleeper_last_served() -> None:
    """Recorded epoch times are shown in UTC in the reason."""
    d = decide(
        "t",
        [
            r("a", State.SERVING, weights=60, served=1_800_000_000.0),
            r("c", State.ASLEEP, weights=60, served=1_764_547_200.0, gpus=(1,)),
            r("t"),
        ],
        H200,
    )
    assert d.evict == ("c",) and "c (asleep, last served 2025-12-01 00:00:00 UTC) is evicted" in d.reasons[0].text
