"""Whether a wake fits: a woken engine takes its gpu_memory_utilization share plus the margin real
vLLM was measured to go beyond it (an H200: up to 722 MiB over the share)."""

from __future__ import annotations

from orchestrator.core.observed import GpuInfo, GpuProcess, GpuSnapshot
from orchestrator.core.sleep_memory import WAKE_MARGIN_MIB, need_mib, wake_blockers

TOTAL = 143_771  # an H200 as nvidia-smi reports it


def snapshot(used_mib: int) -> GpuSnapshot:
    return GpuSnapshot(gpus=(GpuInfo(0, "GPU-0", "NVIDIA H200", TOTAL, used_mib),))


def test_a_wake_with_exactly_its_share_free_is_refused() -> None:
    """Free memory equal to the share alone is not enough: the woken engine goes beyond it."""
    share = int(TOTAL * 0.55)
    reasons = wake_blockers(
        snapshot(TOTAL - share), [0], own_pids=(), sleepers={}, need_mib=need_mib(snapshot(0), [0], 0.55)
    )
    assert reasons == [f"GPU 0 has {share} MiB free, the wake needs {share + WAKE_MARGIN_MIB} MiB more"]


def test_a_wake_with_its_share_and_the_margin_free_fits() -> None:
    """The share plus the margin free: nothing blocks the wake."""
    need = need_mib(snapshot(0), [0], 0.55)
    assert wake_blockers(snapshot(TOTAL - need), [0], own_pids=(), sleepers={}, need_mib=need) == []


def test_engines_that_sleep_first_count_their_memory_above_the_residue_as_free() -> None:
    """Checked before the displaced engine sleeps: what it gives back (all but the residue) counts."""
    need = need_mib(snapshot(0), [0], 0.55)
    held = GpuSnapshot(
        gpus=(GpuInfo(0, "GPU-0", "NVIDIA H200", TOTAL, need + 1_844),),
        processes=(GpuProcess(11, "VLLM::EngineCore", "GPU-0", need + 1_844, 0),),
    )
    assert wake_blockers(held, [0], own_pids=(), leaving={11: ("alpha", 1_844)}, need_mib=need) == []
    assert wake_blockers(held, [0], own_pids=(), need_mib=need) != []


def test_a_short_gpu_names_each_holder_its_mib_and_the_need() -> None:
    """A process of no engine of ours that takes the room is named with its PID and MiB, beside the need."""
    need = need_mib(snapshot(0), [0], 0.55)
    hog = GpuSnapshot(
        gpus=(GpuInfo(0, "GPU-0", "NVIDIA H200", TOTAL, 90_000),),
        processes=(GpuProcess(4412, "python", "GPU-0", 90_000, 0),),
    )
    short = f"GPU 0 has {TOTAL - 90_000} MiB free, the wake needs {need} MiB more"
    assert wake_blockers(hog, [0], own_pids=(), need_mib=need) == [
        f"{short}: PID 4412 (python) holds 90000 MiB on GPU 0"
    ]


def test_a_foreign_process_that_leaves_the_room_blocks_nothing() -> None:
    """Issue 37's rollback: 90.8 GiB free beside a foreign process, 85.4 GiB needed: the wake fits."""
    beside = GpuSnapshot(
        gpus=(GpuInfo(0, "GPU-0", "NVIDIA H200", TOTAL, TOTAL - 92_979),),
        processes=(GpuProcess(4412, "python", "GPU-0", TOTAL - 92_979, 0),),
    )
    assert wake_blockers(beside, [0], own_pids=(), need_mib=87_450) == []


def test_gpus_short_alike_are_one_reason() -> None:
    """A TP group short the same way on each GPU reads once, naming the GPUs, not once per GPU."""
    need = need_mib(snapshot(0), [0], 0.55)
    gpus = tuple(GpuInfo(i, f"GPU-{i}", "NVIDIA H200", TOTAL, 90_000) for i in (0, 1))
    hog = GpuSnapshot(gpus=gpus, processes=tuple(GpuProcess(4412, "python", f"GPU-{i}", 90_000, i) for i in (0, 1)))
    reason = (
        f"GPU 0,1 have {TOTAL - 90_000} MiB free each, the wake needs {need} MiB more: PID 4412 (python) "
        "holds 90000 MiB on GPU 0,1 each"
    )
    assert wake_blockers(hog, [0, 1], own_pids=(), need_mib=need) == [reason]
