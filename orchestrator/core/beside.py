"""Whether a switch's target can start (or wake) beside the models it displaces on the same GPUs,
counted in memory from one nvidia-smi snapshot (no I/O).

The engine takes ``gpu_memory_utilization`` of a GPU's TOTAL memory for itself, and its start fails when
less than that is free; a wake without the memory wedges the engine for good. So beside is allowed
only when, on every GPU of the target, what stays there (each awake engine's share or what it holds,
whichever is more; each sleeper's residue or what it holds; anything else measured now) plus the
target's share and the wake-fit margin fits the GPU, and the memory free now covers the target too.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from orchestrator.core.observed import GpuSnapshot
from orchestrator.core.sleep_memory import WAKE_MARGIN_MIB


@dataclass(frozen=True)
class Holder:
    """An engine the host knows that stays on the GPUs while the target starts."""

    name: str
    gpus: tuple[int, ...]
    pids: frozenset[int]
    utilization: float = 0.0  # awake: the share of each GPU it takes
    asleep: bool = False
    residue_mib: int = 0  # asleep: what a sleeper keeps per GPU (the host's sleep_residue_gib)

    def planned_mib(self, total_mib: int) -> int:
        return self.residue_mib if self.asleep else int(total_mib * self.utilization)


@dataclass(frozen=True)
class GpuRoom:
    """One GPU of the target: what stays there, what the target needs, and what is free now."""

    gpu: int
    total_mib: int
    awake_mib: int  # engines that keep serving meanwhile
    asleep_mib: int  # sleepers' residue
    foreign_mib: int  # processes no engine of the host owns
    need_mib: int  # the target's share plus the wake-fit margin
    free_mib: int  # free now, plus what the target holds already (a sleeping target's residue)
    awake: tuple[str, ...] = ()

    @property
    def held_mib(self) -> int:
        return self.awake_mib + self.asleep_mib + self.foreign_mib

    @property
    def fits(self) -> bool:
        return self.held_mib + self.need_mib <= self.total_mib and self.free_mib >= self.need_mib

    def text(self) -> str:
        who = f" ({', '.join(self.awake)})" if self.awake else ""
        verdict = "fits" if self.fits else "does not fit"
        short = "" if self.free_mib >= self.need_mib else f"; only {self.free_mib:,} MiB free now"
        return (
            f"GPU {self.gpu}: {self.awake_mib:,} MiB awake{who} + {self.asleep_mib:,} asleep + "
            f"{self.foreign_mib:,} other + {self.need_mib:,} target (incl. {WAKE_MARGIN_MIB:,} margin) = "
            f"{self.held_mib + self.need_mib:,} of {self.total_mib:,} MiB: {verdict}{short}"
        )


@dataclass(frozen=True)
class BesideFit:
    """The verdict for every GPU of the target."""

    rooms: tuple[GpuRoom, ...]
    missing: tuple[int, ...] = ()  # GPUs of the target nvidia-smi does not show

    @property
    def fits(self) -> bool:
        return bool(self.rooms) and not self.missing and all(r.fits for r in self.rooms)

    def text(self) -> str:
        parts = [r.text() for r in self.rooms]
        if self.missing:
            parts.append(f"GPU {','.join(map(str, self.missing))} not shown by nvidia-smi")
        return "; ".join(parts)


def beside_fit(
    snap: GpuSnapshot,
    gpus: Collection[int],
    *,
    utilization: float,
    holders: Sequence[Holder],
    own_pids: Collection[int] = (),
) -> BesideFit:
    """Whether an engine at ``utilization`` on ``gpus`` fits beside ``holders`` (``own_pids``: the
    target's processes, when it runs asleep), with the margin the wake-fit check uses."""
    known = {g.index: g for g in snap.gpus}
    own = set(own_pids)
    ours = own | {pid for h in holders for pid in h.pids}
    rooms: list[GpuRoom] = []
    missing: list[int] = []
    for gpu in sorted(set(gpus)):
        info = known.get(gpu)
        if info is None:
            missing.append(gpu)
            continue
        here = [p for p in snap.processes if p.gpu_index == gpu]
        total = info.memory_total_mib
        awake = asleep = 0
        names: list[str] = []
        for h in holders:
            measured = sum(p.used_memory_mib for p in here if p.pid in h.pids)
            if gpu not in h.gpus and not measured:
                continue
            held = max(measured, h.planned_mib(total) if gpu in h.gpus else 0)
            if h.asleep:
                asleep += held
            else:
                awake += held
                names.append(h.name)
        foreign = sum(p.used_memory_mib for p in here if p.pid not in ours)
        mine = sum(p.used_memory_mib for p in here if p.pid in own)
        rooms.append(
            GpuRoom(
                gpu=gpu,
                total_mib=total,
                awake_mib=awake,
                asleep_mib=asleep,
                foreign_mib=foreign,
                need_mib=int(total * utilization) + WAKE_MARGIN_MIB,
                free_mib=info.memory_free_mib + mine,
                awake=tuple(names),
            )
        )
    return BesideFit(tuple(rooms), tuple(missing))
