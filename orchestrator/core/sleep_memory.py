"""GPU memory around sleep and wake, decided from one nvidia-smi snapshot (no I/O).

An engine's sleep can answer 200 and keep gigabytes on the GPU, and a wake without the
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


def sleep_excess(
    snap: GpuSnapshot, gpus: Collection[int], pids: Collection[int], residue_mib: int
) -> tuple[Holding, ...]:
    """The GPUs on which a sleeping engine keeps more than a sleeper's residue (empty: it slept)."""
    return tuple(h for h in holdings(snap, gpus, pids) if h.mib > residue_mib)


def wake_blockers(
    snap: GpuSnapshot,
    gpus: Collection[int],
    *,
    own_pids: Collection[int],
    need_mib: int,
    sleepers: Mapping[int, str] | None = None,
    leaving: Mapping[int, tuple[str, int]] | None = None,
) -> list[str]:
    """Why waking an engine on ``gpus`` would fail (empty: it fits), counted in memory: each GPU's
    free MiB against what the woken engine takes there (``need_mib``, its share with the margin) beyond
    what it holds already. Who else holds memory does not matter, only how much: a process beside it
    that leaves room is no blocker (a rollback must bring back what served beside it a moment ago).

    ``leaving`` maps the PIDs of engines that sleep or stop before the wake to (their model, the MiB
    they keep: a sleeper's residue, 0 for a stop): what they hold beyond it counts as free (the check
    then runs before anything sleeps). ``sleepers``
    maps sleeping engines' PIDs to their model, for the messages. A short GPU names every process
    holding memory there with its MiB, and the MiB the wake needs."""
    asleep, going = sleepers or {}, leaving or {}
    reasons: list[str] = []
    # GPUs short alike (a TP group): one reason for all; keyed by (free, who sleeps first, need, holders).
    short: dict[tuple[int, str, int, tuple[tuple[int, str, int], ...]], list[int]] = {}
    known = {g.index: g for g in snap.gpus}
    for gpu in sorted(set(gpus)):
        info = known.get(gpu)
        if info is None:
            reasons.append(f"GPU {gpu} does not exist: nvidia-smi shows {','.join(map(str, sorted(known))) or 'none'}")
            continue
        here = [p for p in snap.processes if p.gpu_index == gpu]
        own = sum(p.used_memory_mib for p in here if p.pid in own_pids)
        wanted = max(need_mib - own, 0)
        freed = sum(max(p.used_memory_mib - going[p.pid][1], 0) for p in here if p.pid in going)
        free = info.memory_free_mib + freed
        if free >= wanted:
            continue
        once = (
            ", ".join(
                sorted(
                    {f"{going[p.pid][0]} {'sleeps' if going[p.pid][1] else 'stops'}" for p in here if p.pid in going}
                )
            )
            if freed
            else ""
        )
        held = tuple(
            (p.pid, _label(p.pid, p.process_name, asleep, going), p.used_memory_mib)
            for p in sorted(here, key=lambda p: (-p.used_memory_mib, p.pid))
            if p.pid not in own_pids
        )
        short.setdefault((free, once, wanted, held), []).append(gpu)
    for (free, once, wanted, held), alike in short.items():
        where = ",".join(map(str, alike))
        each = " each" if len(alike) > 1 else ""
        text = (
            f"GPU {where} {'have' if each else 'has'} {free} MiB free{each}"
            + (f" once {once} sleeps" if once else "")
            + f", the wake needs {wanted} MiB more"
        )
        holders = [f"PID {pid} ({label}) holds {mib} MiB on GPU {where}{each}" for pid, label, mib in held]
        reasons.append(text + (": " + ", ".join(holders) if holders else ""))
    return reasons


def _label(pid: int, name: str, sleepers: Mapping[int, str], leaving: Mapping[int, tuple[str, int]]) -> str:
    if pid in leaving:
        model, keeps = leaving[pid]
        return f"{model}, to {'sleep' if keeps else 'stop'} first"
    return f"sleeping {sleepers[pid]}" if pid in sleepers else name


# A woken engine holds more than its gpu_memory_utilization share: the real engine's m8 at 0.55 of an
# H200 held 79,460-79,796 MiB against a share of 79,074 (bench/gpu/attempt5). A wake that fits only on
# paper would run out of memory at the edge and wedge the engine, so the check asks for this much more.
WAKE_MARGIN_MIB = 1024


def need_mib(snap: GpuSnapshot, gpus: Collection[int], utilization: float) -> int:
    """The memory an engine at ``utilization`` takes on the smallest of its GPUs when awake, with the
    margin real engines were measured to go beyond it."""
    sizes = [g.memory_total_mib for g in snap.gpus if g.index in set(gpus)]
    return int(min(sizes) * utilization) + WAKE_MARGIN_MIB if sizes else 0
