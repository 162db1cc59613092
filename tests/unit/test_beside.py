"""Whether a switch's target fits beside the model it displaces on the same GPUs, counted in MiB from
one nvidia-smi snapshot: the H200 pair (0.6 + 0.3), a foreign process, sleepers' residue."""

from __future__ import annotations

from orchestrator.core.beside import Holder, beside_fit
from orchestrator.core.observed import GpuInfo, GpuProcess, GpuSnapshot
from orchestrator.core.records import Mode, UnitSpec
from orchestrator.core.sleep_memory import WAKE_MARGIN_MIB
from orchestrator.core.switch_plan import Serving, plan_switch

TOTAL = 143_771  # an H200 as nvidia-smi reports it
BIG = Holder("big", (0,), frozenset({11}), utilization=0.6)
BIG_AWAKE = 86_908  # measured at 0.6


def snap(*procs: tuple[int, str, int]) -> GpuSnapshot:
    used = sum(mib for _, _, mib in procs)
    return GpuSnapshot(
        gpus=(GpuInfo(0, "GPU-0", "NVIDIA H200", TOTAL, used),),
        processes=tuple(GpuProcess(pid, name, "GPU-0", mib, 0) for pid, name, mib in procs),
    )


def need(util: float) -> int:
    return int(TOTAL * util) + WAKE_MARGIN_MIB


def test_the_small_model_fits_beside_the_big_one() -> None:
    """0.3 beside 0.6 on an H200 fits: 86,908 + 44,155 MiB of 143,771."""
    fit = beside_fit(snap((11, "VLLM::EngineCore", BIG_AWAKE)), [0], utilization=0.3, holders=[BIG])
    assert fit.fits
    assert fit.rooms[0].held_mib + fit.rooms[0].need_mib == BIG_AWAKE + need(0.3)


def test_one_mib_over_the_gpu_does_not_fit() -> None:
    """What stays plus the target's share and margin one MiB over the GPU's total: not beside."""
    room = TOTAL - need(0.3)
    fits = beside_fit(snap((11, "VLLM::EngineCore", room)), [0], utilization=0.3, holders=[BIG])
    over = beside_fit(snap((11, "VLLM::EngineCore", room + 1)), [0], utilization=0.3, holders=[BIG])
    assert fits.fits and not over.fits


def test_an_engine_counts_its_share_when_it_holds_less() -> None:
    """An awake engine holding less than its share now may grow to it: its share counts."""
    fit = beside_fit(
        snap((11, "VLLM::EngineCore", 10_000)),
        [0],
        utilization=0.35,
        holders=[Holder("big", (0,), frozenset({11}), utilization=0.7)],
    )
    assert fit.rooms[0].awake_mib == int(TOTAL * 0.7)
    assert not fit.fits


def test_a_foreign_process_counts_against_the_room() -> None:
    """A process no engine of the host owns (measured now) can tip the verdict."""
    alone = beside_fit(snap((11, "VLLM::EngineCore", BIG_AWAKE)), [0], utilization=0.3, holders=[BIG])
    foreign = beside_fit(
        snap((11, "VLLM::EngineCore", BIG_AWAKE), (99, "python", 13_000)), [0], utilization=0.3, holders=[BIG]
    )
    assert alone.fits and not foreign.fits
    assert foreign.rooms[0].foreign_mib == 13_000
    assert "13,000 other" in foreign.text()


def test_sleepers_residue_counts_against_the_room() -> None:
    """A sleeper keeps the host's residue (or what it holds, if more) on the target's GPU."""
    sleeper = Holder("old", (0,), frozenset({22}), asleep=True, residue_mib=3_072)
    tight = TOTAL - need(0.3) - 2_000
    fit = beside_fit(
        snap((11, "VLLM::EngineCore", tight), (22, "VLLM::EngineCore", 1_200)),
        [0],
        utilization=0.3,
        holders=[BIG, sleeper],
    )
    assert fit.rooms[0].asleep_mib == 3_072
    assert not fit.fits


def test_a_sleeping_target_counts_its_own_residue_as_its_own() -> None:
    """Waking beside: the target's own residue is free to it, not held by others."""
    total_held = TOTAL - need(0.3) + 1_500
    fit = beside_fit(
        snap((11, "VLLM::EngineCore", total_held - 1_500), (33, "VLLM::EngineCore", 1_500)),
        [0],
        utilization=0.3,
        holders=[BIG],
        own_pids={33},
    )
    assert fit.fits and fit.rooms[0].foreign_mib == 0


def test_a_gpu_nvidia_smi_does_not_show_never_fits() -> None:
    """A target GPU missing from the snapshot: not beside."""
    fit = beside_fit(snap(), [0, 1], utilization=0.3, holders=[])
    assert not fit.fits and fit.missing == (1,)


def spec(model: str, unit: str | None = None) -> UnitSpec:
    return UnitSpec(
        model=model,
        unit_name=unit or f"vllm-{model}.service",
        unit_text="",
        unit_sha="",
        served_name="chat",
        address="127.0.0.1",
        port=8001,
        gpus=(0,),
        load_deadline_s=60,
        model_dir="/m",
    )


def test_a_stop_start_that_fits_is_planned_beside_with_the_figures() -> None:
    """Same GPUs, same name, room for both: mode beside, nothing stops first, the reason says no gap."""
    fit = beside_fit(snap((11, "VLLM::EngineCore", BIG_AWAKE)), [0], utilization=0.3, holders=[BIG])
    plan = plan_switch(spec("small"), [Serving(1, spec("big"))], fit)
    assert plan.mode is Mode.BESIDE and plan.keeps_serving
    assert plan.displaced == (1,) and plan.overlapping == ()
    assert plan.reason.startswith("no gap: small starts beside big on GPU 0")
    assert "131,063 of 143,771 MiB" in plan.reason


def test_a_stop_start_that_does_not_fit_stays_stop_start_and_says_why() -> None:
    """No room: stop-start, with the figures that ruled beside out."""
    fit = beside_fit(snap((11, "VLLM::EngineCore", BIG_AWAKE)), [0], utilization=0.5, holders=[BIG])
    plan = plan_switch(spec("small"), [Serving(1, spec("big"))], fit)
    assert plan.mode is Mode.STOP_START
    assert "not beside: GPU 0:" in plan.reason and "does not fit" in plan.reason


def test_a_redeploy_of_the_same_unit_is_never_beside() -> None:
    """The target's own unit serves: it cannot run twice, whatever the memory says."""
    fit = beside_fit(snap((11, "VLLM::EngineCore", 1_000)), [0], utilization=0.1, holders=[BIG])
    plan = plan_switch(spec("big"), [Serving(1, spec("big"))], fit)
    assert plan.mode is Mode.STOP_START
