"""Whether a wake fits: a woken engine takes its gpu_memory_utilization share plus the margin real
vLLM was measured to go beyond it (an H200: up to 722 MiB over the share)."""

from __future__ import annotations

from orchestrator.core.observed import GpuInfo, GpuSnapshot
from orchestrator.core.sleep_memory import WAKE_MARGIN_MIB, need_mib, wake_blockers

TOTAL = 143_771  # an H200 as nvidia-smi reports it


def snapshot(used_mib: int) -> GpuSnapshot:
    return GpuSnapshot(gpus=(GpuInfo(0, "GPU-0", "NVIDIA H200", TOTAL, used_mib),))


def test_a_wake_with_exactly_its_share_free_is_refused() -> None:
    """Free memory equal to the share alone is not enough: the woken engine goes beyond it."""
    share = int(TOTAL * 0.55)
    reasons = wake_blockers(snapshot(TOTAL - share), [0], own_pids=(), sleepers={}, residue_mib=1_844,
                            need_mib=need_mib(snapshot(0), [0], 0.55))
    assert reasons == [f"GPU 0 has {share} MiB free, the wake needs {share + WAKE_MARGIN_MIB} MiB more"]


def test_a_wake_with_its_share_and_the_margin_free_fits() -> None:
    """The share plus the margin free: nothing blocks the wake."""
    need = need_mib(snapshot(0), [0], 0.55)
    assert wake_blockers(snapshot(TOTAL - need), [0], own_pids=(), sleepers={}, residue_mib=1_844,
                         need_mib=need) == []
