"""Sleep, wake and their checks on one engine: what a warm switch is made of.

Free of systemd on purpose (a base URL, the engine's PIDs, an EngineControl, a GpuProbe and a
Clock): the steps call these with a unit's cgroup PIDs; the H200 script calls them with the PIDs of
an engine's process tree started by hand.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from orchestrator.core.records import UnitSpec
from orchestrator.core.sleep_memory import holdings, need_mib, sleep_excess, wake_blockers
from orchestrator.engines import engine_named
from orchestrator.errors import EngineError, EngineWedged, GpuBusy, SleepLeftMemory
from orchestrator.ports import Clock, EngineControl, GpuProbe

POLL_S = 0.05  # memory checks poll this often: a snapshot costs ~1 ms with NVML, one process with nvidia-smi


def sleep_enabled(spec: UnitSpec) -> bool:
    """Whether the unit runs its engine with sleep mode (rendered only for a model with ``sleep``): its
    engine reads the unit."""
    return engine_named(spec.engine).sleeps(spec.unit_text)


@dataclass(frozen=True)
class EngineProcess:
    """One running engine (a model's process tree, its URL and GPUs) as the warm code sees it."""

    name: str  # the model (messages name it)
    base_url: str
    gpus: tuple[int, ...]
    pids: frozenset[int]
    utilization: float = 0.9
    served: str = ""  # the served model name (the completion asks for it); default: name

    @property
    def model(self) -> str:
        return self.served or self.name


def sleep_verified(
    control: EngineControl,
    probe: GpuProbe,
    clock: Clock,
    engine: EngineProcess,
    *,
    level: int,
    residue_mib: int,
    mode: str = "wait",
    settle_s: float = 5.0,
) -> float:
    """Put ``engine`` to sleep (unless it says it sleeps already) and prove it gave its GPUs back;
    returns the seconds the sleep took.

    A sleep that answers 200 but keeps more than ``residue_mib`` on a GPU after ``settle_s`` raises
    SleepLeftMemory naming the PID and memory: the caller stops that engine instead."""
    started = clock.monotonic()
    if not control.is_sleeping(engine.base_url):
        control.sleep(engine.base_url, level, mode)
    took = clock.monotonic() - started
    deadline = clock.monotonic() + settle_s
    while True:
        excess = sleep_excess(probe.snapshot(), engine.gpus, engine.pids, residue_mib)
        if not excess:
            return took
        if clock.monotonic() >= deadline:
            raise SleepLeftMemory(
                f"{engine.name} answered its sleep (level {level}) with 200 but still holds "
                f"{'; '.join(h.text() for h in excess)}, more than the {residue_mib} MiB residue of a sleeper"
            )
        clock.sleep(POLL_S)


def wake_shortfall(
    probe: GpuProbe,
    engine: EngineProcess,
    *,
    sleepers: Mapping[int, str] | None = None,
    leaving: Mapping[int, tuple[str, int]] | None = None,
) -> list[str]:
    """Why ``engine``'s GPUs lack the memory its wake takes (core.sleep_memory's count; ``leaving``:
    PID -> (model, MiB it keeps) of engines that sleep or stop first; ``sleepers``: for messages)."""
    snap = probe.snapshot()
    return wake_blockers(
        snap,
        engine.gpus,
        own_pids=engine.pids,
        sleepers=sleepers,
        leaving=leaving,
        need_mib=need_mib(snap, engine.gpus, engine.utilization),
    )


def check_wake_fits(probe: GpuProbe, engine: EngineProcess, *, sleepers: Mapping[int, str] | None = None) -> None:
    """Raise GpuBusy unless ``engine``'s GPUs have the memory its wake takes, now."""
    reasons = wake_shortfall(probe, engine, sleepers=sleepers)
    if reasons:
        raise GpuBusy(f"{engine.name} is not woken: its GPUs lack the memory it needs: " + "; ".join(reasons))


def wake_checked(
    control: EngineControl, clock: Clock, engine: EngineProcess, *, level: int, deadline_s: float
) -> float:
    """Wake ``engine`` (its sleep API's level-2 sequence for level 2) and prove it serves with one completion
    within ``deadline_s`` of the wake's start; returns the seconds that took.

    Anything else is EngineWedged with the engine's own words: an engine half-woken after an error keeps
    memory and hangs every request, and only a restart frees it."""
    started = clock.monotonic()
    try:
        if not control.is_sleeping(engine.base_url):
            pass  # woken already (a run resumed after a crash): the completion still decides
        elif level == 2:
            control.wake(engine.base_url, ("weights",))
            control.reload_weights(engine.base_url)
            control.wake(engine.base_url, ("kv_cache",))
            control.reset_prefix_cache(engine.base_url)
        else:
            control.wake(engine.base_url)
        if control.is_sleeping(engine.base_url):
            raise EngineError(f"GET {engine.base_url}/is_sleeping: still true after the wake answered 200")
        left = deadline_s - (clock.monotonic() - started)
        if left <= 0:
            raise EngineError(f"the wake took {clock.monotonic() - started:.2f} s, the whole wake_deadline_s")
        control.complete(engine.base_url, engine.model, timeout=left)
    except EngineError as exc:
        raise EngineWedged(
            f"{engine.name} is wedged after its wake (level {level}, wake_deadline_s {deadline_s:g}): {exc}",
            status=exc.status,
            body=exc.body,
        ) from exc
    return clock.monotonic() - started


def held_mib(probe: GpuProbe, engine: EngineProcess) -> dict[int, int]:
    """GPU index -> MiB the engine's processes hold there now."""
    return {h.gpu: h.mib for h in holdings(probe.snapshot(), engine.gpus, engine.pids)}


def pids_holding(probe: GpuProbe, gpus: Collection[int]) -> dict[int, int]:
    """PID -> MiB of every process on ``gpus`` (for messages and the H200 script)."""
    out: dict[int, int] = {}
    for p in probe.snapshot().processes:
        if p.gpu_index in set(gpus):
            out[p.pid] = out.get(p.pid, 0) + p.used_memory_mib
    return out
