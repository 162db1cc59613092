"""GPU memory around sleep and wake, decided from one nvidia-smi snapshot (no I/O).

vLLM's ``/sleep`` can answer 200 and keep gigabytes on the GPU, and a ``/wake_up`` without the
memory leaves the engine wedged for good: both are judged here by PID, from what nvidia-smi shows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from orchestrator.core.observed import GpuSnapshot


@dataclass(frozen=True)
class Holding:
    """Memory one engine's processes hold on one GPU."""

    gpu: int
    mib: int
    pids: tuple[int, ...]

    def text(self) -> str:
        return f"PID {','.join(map(str, self.pids))} holds {self.mib} MiB on GPU {self.gpu}"


def holdings(snap: GpuSnapshot, gpus: Collection[int], pids: Collection[int]) -> tuple[Holding, ...]:
    """What ``pids`` hold on each of ``gpus`` (an engine's API server and EngineCore: summed)."""
    out = []
    for gpu in sorted(set(gpus)):
        mine = [p for p in snap.processes if p.gpu_index == gpu and p.pid in pids]
        if mine:
            out.append(Holding(gpu, sum(p.used_memory_mib for p in mine), tuple(sorted({p.pid for p in mine}))))
    return tuple(out)


def sleep_excess(snap: GpuSnapshot, gpus: Collection[int], pids: Collection[int],
                 residue_mib: int) -> tuple[Holding, ...]:
    """The GPUs on which a sleeping engine keeps more than a sleeper's residue (empty: it slept)."""
    return tuple(h for h in holdings(snap, gpus, pids) if h.mib > residue_mib)


def wake_blockers(snap: GpuSnapshot, gpus: Collection[int], *, own_pids: Collection[int],
                  sleepers: Mapping[int, str], residue_mib: int, need_mib: int) -> list[str]:
    """Why waking an engine on ``gpus`` would fail (empty: it fits): each reason names the PID and
    what it holds. ``sleepers`` maps the PIDs of other sleeping engines to their model; they may keep
    their residue, nothing else may hold memory there; ``need_mib`` is what the woken engine takes
    on each GPU (its gpu_memory_utilization share), of which it holds its own residue already."""
    reasons: list[str] = []
    known = {g.index: g for g in snap.gpus}
    for gpu in sorted(set(gpus)):
        info = known.get(gpu)
        if info is None:
            reasons.append(f"GPU {gpu} does not exist: nvidia-smi shows {','.join(map(str, sorted(known))) or 'none'}")
            continue
        for proc in snap.processes:
            if proc.gpu_index != gpu or proc.pid in own_pids:
                continue
            owner = sleepers.get(proc.pid)
            if owner is None:
                reasons.append(f"PID {proc.pid} ({proc.process_name}) holds {proc.used_memory_mib} MiB on GPU {gpu} "
                               "and is no sleeping engine")
            elif proc.used_memory_mib > residue_mib:
                reasons.append(f"PID {proc.pid} (sleeping {owner}) holds {proc.used_memory_mib} MiB on GPU {gpu}, "
                               f"more than the {residue_mib} MiB residue of a sleeper")
        own = sum(p.used_memory_mib for p in snap.processes if p.gpu_index == gpu and p.pid in own_pids)
        wanted = max(need_mib - own, 0)
        if info.memory_free_mib < wanted:
            reasons.append(f"GPU {gpu} has {info.memory_free_mib} MiB free, the wake needs {wanted} MiB more")
    return reasons


# A woken engine holds more than its gpu_memory_utilization share: real vLLM 0.25.1's m8 at 0.55 of an
# H200 held 79,460-79,796 MiB against a share of 79,074 (bench/gpu/attempt5). A wake that fits only on
# paper would run out of memory at the edge and wedge the engine, so the check asks for this much more.
WAKE_MARGIN_MIB = 1024


def need_mib(snap: GpuSnapshot, gpus: Collection[int], utilization: float) -> int:
    """The memory an engine at ``utilization`` takes on the smallest of its GPUs when awake, with the
    margin real engines were measured to go beyond it."""
    sizes = [g.memory_total_mib for g in snap.gpus if g.index in set(gpus)]
    return int(min(sizes) * utilization) + WAKE_MARGIN_MIB if sizes else 0
