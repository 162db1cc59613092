"""Each model of a host as its records and its engine say: serving, asleep or stopped (the residency
store, ``mark``), the engines that sleep and the residue they may keep on a GPU, an engine's PIDs and
weights, its sleep level and wake deadline; and the notes the warm steps keep with a deployment.

Only reads, and the residency record; what acts on an engine is deploy/sleep_or_stop.py (sleep, wake,
sleep-or-stop) and deploy/actions.py (stop_and_free).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from orchestrator.core import residency as rules
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import UnitSpec
from orchestrator.core.resident import ASLEEP
from orchestrator.deploy import warm
from orchestrator.deploy.context import StepContext
from orchestrator.engines import engine_named
from orchestrator.errors import EngineError
from orchestrator.ports import HostPorts

WARM_EVENT = "warm"  # the kind of ctx.record entries the warm steps write


def note(ctx: StepContext, what: str, **detail: object) -> None:
    """Persist (with the deployment) and show one thing the warm steps did or an engine said."""
    ctx.record(WARM_EVENT, {"step": what, **detail})
    ctx.emit(what, **detail)


def level_of(ctx: StepContext, model: str) -> str | None:
    m = ctx.catalog.models.get(model)
    return None if m is None else m.sleep


def on_demand(ctx: StepContext, model: str) -> bool:
    m = ctx.catalog.models.get(model)
    return m is not None and m.on_demand


def level_number(spec: UnitSpec, level: str | None) -> int:
    """The level ``spec``'s engine's sleep API takes for a model's `sleep` (its engine says)."""
    return engine_named(spec.engine).sleep_level(level or "level1")


def residue_mib(ctx: StepContext) -> int:
    return int(ctx.ports.host.sleep_residue_gib * 1024)


def unit_pids(ctx: StepContext, unit: str, *, reuse: bool = False) -> frozenset[int]:
    """The unit's cgroup PIDs; with ``reuse`` (inside the warm window) as read earlier in this run."""
    if reuse and unit in ctx.seen_pids:
        return ctx.seen_pids[unit]
    pids = ctx.seen_pids[unit] = frozenset(ctx.ports.systemd.cgroup_pids(unit))
    return pids


def engine_of(ctx: StepContext, spec: UnitSpec, *, reuse: bool = False) -> warm.EngineProcess:
    model = ctx.catalog.models.get(spec.model)
    util = rules.utilization(ctx.catalog, model) if model is not None else ctx.defaults.gpu_memory_utilization
    return warm.EngineProcess(
        spec.model,
        spec.base_url,
        spec.gpus,
        unit_pids(ctx, spec.unit_name, reuse=reuse),
        utilization=util,
        served=spec.served_name,
    )


def deadline_of(ctx: StepContext, model: str) -> float:
    m = ctx.catalog.models.get(model)
    return ctx.defaults.wake_deadline_s if m is None else rules.wake_deadline(ctx.catalog, m)


def loaded_asleep(ports: HostPorts, catalog: Catalog, spec: UnitSpec) -> bool:
    """``spec``'s model sleeps at level 1 under this very unit: its engine loaded with it and holds its
    port and its weights (in host RAM); a wake starts no process and reads no file."""
    m = catalog.models.get(spec.model)
    control = ports.engine_control_for(spec)
    if (
        m is None
        or m.sleep != "level1"
        or control is None
        or ports.systemd.read_unit(spec.unit_name) != spec.unit_text
        or not ports.systemd.unit_state(spec.unit_name).is_active
    ):
        return False
    try:
        return bool(control.is_sleeping(spec.base_url))
    except EngineError:
        return False


def is_asleep(ctx: StepContext, spec: UnitSpec) -> bool:
    """The engine runs and says it sleeps (``/health`` answers 200 while asleep: it cannot tell)."""
    control = ctx.ports.engine_control_for(spec)
    if control is None or not ctx.ports.systemd.unit_state(spec.unit_name).is_active:
        return False
    try:
        return control.is_sleeping(spec.base_url)
    except EngineError:
        return False


def awake(ctx: StepContext, spec: UnitSpec) -> bool:
    """The engine runs and can answer: not asleep, and (with sleep mode) it answers ``/is_sleeping``.
    Only such an engine may have a route: a request sent to a sleeper waits for a wake that may never
    come, and one sent to an engine that does not answer hangs or is cut."""
    control = ctx.ports.engine_control_for(spec)
    if not ctx.ports.systemd.unit_state(spec.unit_name).is_active:
        return False
    if control is None:
        return True
    try:
        return not control.is_sleeping(spec.base_url)
    except EngineError:
        return False


def mark(
    ctx: StepContext,
    model: str,
    state: str,
    *,
    level: str | None = None,
    unit: str = "",
    weights_gib: float | None = None,
) -> None:
    if ctx.residency is not None:
        ctx.residency.set_state(
            ctx.ports.host.name, model, state, ctx.ports.clock.now(), level=level, unit=unit, weights_gib=weights_gib
        )


def weights_gib(ctx: StepContext, spec: UnitSpec) -> float:
    """The size of the engine's weights on the host (``du``): what a level1 sleeper holds in host RAM."""
    res = ctx.ports.shell.run(["du", "-sbL", spec.model_dir], check=False, idempotent=True)
    head = res.stdout.split()[:1]
    return int(head[0]) / 2**30 if res.ok and head and head[0].isdigit() else 0.0


# Per host (its shell, which runs ``du``): (unit, model folder, main PID, when it started) -> GiB. What a running
# engine loaded does not change while that process runs, so ``du`` is read once per engine process (an
# on-demand swap's wait had it each time). A restart is a new key; the oldest go past LOADED_MAX.
_LOADED: weakref.WeakKeyDictionary[object, dict[tuple[str, str, int, float], float]] = weakref.WeakKeyDictionary()
LOADED_MAX = 64


def loaded_gib(ctx: StepContext, spec: UnitSpec) -> float:
    """``weights_gib`` of a running engine: what it loaded, and sleeping at level 1 holds in host RAM."""
    state = ctx.ports.systemd.unit_state(spec.unit_name)
    if not state.is_active or state.started_at is None or not state.main_pid:
        return weights_gib(ctx, spec)
    known = _LOADED.setdefault(ctx.ports.shell, {})
    key = (spec.unit_name, spec.model_dir, state.main_pid, state.started_at)
    if key not in known:
        while len(known) >= LOADED_MAX:
            del known[next(iter(known))]
        known[key] = weights_gib(ctx, spec)
    return known[key]


def sleepers(ctx: StepContext, but: Iterable[str] = (), *, reuse: bool = False) -> dict[int, str]:
    """PID -> model of every engine recorded asleep on the host (their residue may stay on a GPU)."""
    if ctx.residency is None:
        return {}
    skip = set(but)
    out: dict[int, str] = {}
    for name, r in ctx.residency.residency(ctx.ports.host.name).items():
        if r.state == ASLEEP and name not in skip and r.unit:
            out.update({pid: name for pid in unit_pids(ctx, r.unit, reuse=reuse)})
    return out


def sleeper_mib(ctx: StepContext, but: Iterable[str] = ()) -> dict[int, int]:
    """PID -> the most memory it may keep: the free check of the cold path lets sleepers' residue be."""
    return dict.fromkeys(sleepers(ctx, but), residue_mib(ctx))


def asleep_units(ctx: StepContext, but: Iterable[str] = ()) -> set[str]:
    """The units of models recorded asleep (a cold switch must not stop them unless evicted)."""
    if ctx.residency is None:
        return set()
    skip = set(but)
    return {
        r.unit
        for n, r in ctx.residency.residency(ctx.ports.host.name).items()
        if r.state == ASLEEP and n not in skip and r.unit
    }
