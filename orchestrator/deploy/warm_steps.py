"""The warm path's steps and the sleep-aware parts of the cold one (see core/states.py's table).

Every step observes first (the unit, ``/is_sleeping``, nvidia-smi by PID) so that a run resumed
after a crash finishes what the killed one began. What an engine said when it failed (a sleep that
kept its memory, a wedged wake) is recorded as an event with the deployment and in the progress.
"""

from __future__ import annotations

import signal
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.core import residency as rules
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import Deployment, Mode, UnitSpec
from orchestrator.core.resident import ASLEEP, SERVING, STOPPED, State
from orchestrator.core.states import Phase
from orchestrator.deploy import actions, warm
from orchestrator.deploy.context import StepContext, StepInput
from orchestrator.deploy.warm import POLL_S, sleep_enabled
from orchestrator.engines import engine_named
from orchestrator.errors import EngineError, EngineWedged, GpuBusy, OrchestratorError, SleepLeftMemory
from orchestrator.ports import HostPorts

WARM_EVENT = "warm"  # the kind of ctx.record entries the warm steps write
FATE_EVENT = "fate"  # the warm note with the displaced models' fate, decided in staging


def level_of(ctx: StepContext, model: str) -> str | None:
    m = ctx.catalog.models.get(model)
    return None if m is None else m.sleep


def on_demand(ctx: StepContext, model: str) -> bool:
    m = ctx.catalog.models.get(model)
    return m is not None and m.on_demand


def _level_number(spec: UnitSpec, level: str | None) -> int:
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


# Per host (its systemd port): (unit, model folder, main PID, when it started) -> GiB. What a running
# engine loaded does not change while that process runs, so ``du`` is read once per engine process (an
# on-demand swap's wait had it each time). A restart is a new key; the oldest go past LOADED_MAX.
_LOADED: weakref.WeakKeyDictionary[object, dict[tuple[str, str, int, float], float]] = weakref.WeakKeyDictionary()
LOADED_MAX = 64


def loaded_gib(ctx: StepContext, spec: UnitSpec) -> float:
    """``weights_gib`` of a running engine: what it loaded, and sleeping at level 1 holds in host RAM."""
    state = ctx.ports.systemd.unit_state(spec.unit_name)
    if not state.is_active or state.started_at is None or not state.main_pid:
        return weights_gib(ctx, spec)
    known = _LOADED.setdefault(ctx.ports.systemd, {})
    key = (spec.unit_name, spec.model_dir, state.main_pid, state.started_at)
    if key not in known:
        while len(known) >= LOADED_MAX:
            del known[next(iter(known))]
        known[key] = weights_gib(ctx, spec)
    return known[key]


def note(ctx: StepContext, what: str, **detail: object) -> None:
    """Persist (with the deployment) and show one thing the warm steps did or an engine said."""
    ctx.record(WARM_EVENT, {"step": what, **detail})
    ctx.emit(what, **detail)


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


# -- what a switch does to the other models --------------------------------------------------------
@dataclass(frozen=True)
class Fate:
    sleep: tuple[str, ...]  # displaced models that sleep
    stop: tuple[str, ...]  # displaced models that stop
    evict: tuple[str, ...]  # sleepers stopped to make room
    reasons: tuple[str, ...]
    weights: Mapping[str, float] = field(default_factory=dict)  # displaced model -> GiB of weights (du)
    why: Mapping[str, str] = field(default_factory=dict)  # model -> the decision's first reason about it

    def reason(self, model: str, default: str = "") -> str:
        return self.why.get(model, default)


def fate(ctx: StepContext, step: StepInput) -> Fate:
    """core.residency's decision for this switch, from the catalog and the recorded residency."""
    host = ctx.ports.host
    records = ctx.residency.residency(host.name) if ctx.residency is not None else {}
    displaced = {d.model: d.spec for d in step.displaced}
    residents = []
    sizes = {name: loaded_gib(ctx, spec) for name, spec in displaced.items()}
    for name in ctx.catalog.models_on(host.name):
        model = ctx.catalog.models[name]
        rec = records.get(name)
        # Observed, not only recorded: a unit stopped behind the records' back holds nothing.
        state = State.STOPPED
        if ctx.ports.systemd.unit_state(model.unit_name).is_active:
            state = State.ASLEEP if rec is not None and rec.state == ASLEEP else State.SERVING
        if name == step.dep.model:
            state = State.ASLEEP if is_asleep(ctx, step.dep.spec) else State.STOPPED
        size = sizes[name] if name in displaced else (rec.weights_gib if rec else 0.0)
        residents.append(
            rules.Resident(
                name=name,
                gpus=model.gpus,
                gpu_memory_utilization=rules.utilization(ctx.catalog, model),
                sleep=model.sleep,
                weights_gib=size,
                state=state,
                level=rec.level if rec is not None else None,
                last_served=rec.last_served if rec is not None else None,
                served_name=model.served,
            )
        )
    decision = rules.decide(
        step.dep.model, residents, rules.budgets_for(host, _mem_total_gib(ctx)), displaced=list(displaced)
    )
    why = {r.model: decision.reason(r.model) for r in decision.reasons}
    return Fate(decision.sleep, decision.stop, decision.evict, tuple(r.text for r in decision.reasons), sizes, why)


def decide(ctx: StepContext, step: StepInput) -> Fate:
    """Decide (and persist) what the switch does to the displaced models before the window opens:
    the sleeping step then only acts (no unit reads, no ``du`` between the route move and the wake)."""
    decided = fate(ctx, step)
    note(
        ctx,
        FATE_EVENT,
        sleep=list(decided.sleep),
        stop=list(decided.stop),
        evict=list(decided.evict),
        reasons=list(decided.reasons),
        weights=dict(decided.weights),
        why=dict(decided.why),
    )
    return decided


def recorded_fate(step: StepInput) -> Fate | None:
    """The decision ``decide`` persisted for this deployment (a resumed run acts on the same one)."""
    for p in reversed(step.warm_progress):
        if p.get("step") == FATE_EVENT:
            return Fate(
                tuple(p.get("sleep", ())),
                tuple(p.get("stop", ())),
                tuple(p.get("evict", ())),
                tuple(p.get("reasons", ())),
                dict(p.get("weights", {})),
                dict(p.get("why", {})),
            )
    return None


def _mem_total_gib(ctx: StepContext) -> float | None:
    """The box's MemTotal (for a host without memory_gib or sleep_ram_gib)."""
    if ctx.ports.host.sleep_ram_gib is not None or ctx.ports.host.memory_gib is not None:
        return None
    data = ctx.ports.shell.read_file("/proc/meminfo") or b""
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("MemTotal:") and line.split()[1].isdigit():
            return int(line.split()[1]) / 2**20
    return None


def put_to_sleep(ctx: StepContext, step: StepInput, leaving: Iterable[Deployment], *, window: bool = False) -> set[str]:
    """Sleep (mode=wait) or stop each displaced engine as the decision says, evict what it names;
    returns the units that now sleep. A sleep that errs or keeps its memory stops that engine.
    ``window``: a warm switch's, with the route on its target: reuse what staging read."""
    decided = recorded_fate(step) or fate(ctx, step)
    asleep: set[str] = set()
    for d in leaving:
        spec, unit = d.spec, d.spec.unit_name
        if not ctx.ports.systemd.unit_state(unit).is_active:
            mark(ctx, d.model, STOPPED, unit=unit)
            continue
        level, control = level_of(ctx, d.model), ctx.ports.engine_control_for(spec)
        if d.model in decided.sleep and control is not None and level is not None:
            try:
                took = warm.sleep_verified(
                    control,
                    ctx.ports.gpus,
                    ctx.ports.clock,
                    engine_of(ctx, spec, reuse=window),
                    level=_level_number(spec, level),
                    residue_mib=residue_mib(ctx),
                )
                size = decided.weights.get(d.model)
                mark(
                    ctx,
                    d.model,
                    ASLEEP,
                    level=level,
                    unit=unit,
                    weights_gib=weights_gib(ctx, spec) if size is None else size,
                )
                note(ctx, "slept", model=d.model, level=level, seconds=round(took, 3))
                asleep.add(unit)
                continue
            except (SleepLeftMemory, EngineError) as exc:
                note(ctx, "sleep_failed", model=d.model, error=str(exc), then="stopped instead")
        else:
            why = decided.reason(d.model, "no sleep mode")
            note(ctx, "stopping", model=d.model, reason=why)
        actions.stop_units(ctx, {unit})
        mark(ctx, d.model, STOPPED, unit=unit)
    for name in decided.evict:
        unit = ctx.catalog.models[name].unit_name
        note(ctx, "evicted", model=name, reason=decided.reason(name))
        actions.stop_units(ctx, {unit})
        mark(ctx, name, STOPPED, unit=unit)
    return asleep


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


# -- the warm path's steps -------------------------------------------------------------------------
def beside(step: StepInput) -> bool:
    """The switch starts or wakes its target beside the engines it displaces (core.beside): they
    serve until the route moves, and sleep or stop only then."""
    return step.plan is not None and step.plan.mode is Mode.BESIDE


def check_wake_first(ctx: StepContext, step: StepInput, target: UnitSpec) -> None:
    """Before anything sleeps (staging, once it found the target asleep): the target's wake must fit
    in what its GPUs will have free once the displaced engines sleep (down to their residue) or stop
    (no sleep mode), counted in memory; else GpuBusy (the switch aborts, nothing changed) naming who
    holds what and the need. A sleep that the RAM budget turns into a stop is counted as a sleep."""
    sd = ctx.ports.systemd
    leaving: dict[int, tuple[str, int]] = {}
    for d in step.displaced:
        if d.spec.unit_name == target.unit_name or not sd.unit_state(d.spec.unit_name).is_active:
            continue
        keeps = residue_mib(ctx) if level_of(ctx, d.model) is not None and sleep_enabled(d.spec) else 0
        leaving.update(dict.fromkeys(unit_pids(ctx, d.spec.unit_name), (d.model, keeps)))
    reasons = warm.wake_shortfall(
        ctx.ports.gpus, engine_of(ctx, target), sleepers=sleepers(ctx, but=[target.model]), leaving=leaving
    )
    if reasons:
        raise GpuBusy(
            f"{target.model} cannot wake, so nothing was put to sleep and the route did not move: "
            + "; ".join(reasons),
            host=ctx.ports.host.name,
        )


def sleeping(ctx: StepContext, step: StepInput) -> None:
    """The route moves to the target (asleep: its engine holds what arrives until the wake), the
    displaced engines finish what they serve (drain, then sleep mode=wait) and sleep, or stop. A
    target on demand: only the displaced engines leave the running proxy (withdraw, no reload)."""
    dep = step.dep
    if beside(step):
        return  # the target wakes beside them; the route moves and they sleep in `routing`
    leaving = [d for d in step.displaced if d.spec.unit_name != dep.spec.unit_name]
    if not on_demand(ctx, dep.model):
        # The config checked first: once the wait reads none in flight, the route move is the runtime
        # API's state change between the name's servers (the target an alternate of the same served
        # name: no reload), else the reload alone (a request that reaches them before it lands holds
        # their sleep like one in flight now).
        actions.prepare_route(ctx, [*(d.spec for d in step.kept), dep.spec])
        await_quiet(ctx, leaving)
    # On demand, the target's requests are held by the proxy until its swap releases them (checked
    # awake): only the displaced engines' routes must go before they sleep, which the running proxy
    # does at once; the reload that routes the target comes in `routing`, past the held requests' wait.
    withdrew = on_demand(ctx, dep.model) and (not leaving or actions.withdraw(ctx, (d.spec for d in leaving)))
    if not withdrew:
        actions.route(ctx, [*(d.spec for d in step.kept), dep.spec])
    started = ctx.ports.clock.monotonic()
    actions.drain(ctx, (d.spec for d in leaving))
    # Kept with the deployment: what the displaced engines still served (their in-flight requests) is
    # part of a warm switch's gap that is theirs, not the switch's (bench/warm: gap - this - sleep - wake).
    ctx.record(WARM_EVENT, {"step": "drained", "seconds": round(ctx.ports.clock.monotonic() - started, 3)})
    put_to_sleep(ctx, step, leaving, window=True)


def await_quiet(ctx: StepContext, leaving: Iterable[Deployment]) -> None:
    """Move the route at a quiet moment of the displaced engines (actions.await_quiet, bounded by
    ``[proxy] quiet_wait_s``): a request they still run when it moves holds their sleep, the target's
    wake and so every client's gap; before it moves they serve, and nobody waits. Kept with the
    deployment (how long, and whether it ended quiet) beside the drain that follows. Not for a target
    on demand (the caller): its requests are held from their arrival, so the wait would be theirs, and
    it is never shorter than the drain it spares (that ends with what is in flight now; quiet needs a
    moment with none)."""
    leaving = list(leaving)
    quiet, waited = actions.await_quiet(ctx, (d.spec for d in leaving))
    if quiet.outcome != "off":
        note(
            ctx,
            "quiet",
            seconds=round(waited, 3),
            outcome=quiet.outcome,
            in_flight=quiet.in_flight,
            result=QUIET_RESULTS[quiet.outcome].format(n=quiet.in_flight, bound=ctx.catalog.proxy.quiet_wait_s),
            engines=[f"{d.spec.address}:{d.spec.port}" for d in leaving],
        )


QUIET_RESULTS = {
    "quiet": "nothing in flight: the route moves",
    "bound": "{n} still in flight at quiet_wait_s ({bound:g} s): the route moves, the drain waits for them",
    "unknown": "the proxy gave no count: the route moves",
}


def verifying(ctx: StepContext, step: StepInput) -> None:
    """Never wake without the memory: the target's GPUs have what its wake takes, counted by PID (the
    same count passed before anything slept; this one sees what the sleeps really gave back)."""
    dep, clock = step.dep, ctx.ports.clock
    eng = engine_of(ctx, dep.spec, reuse=True)
    deadline = clock.monotonic() + ctx.defaults.free_timeout_s
    while True:
        try:
            # A fresh snapshot, not the one the sleep ended on: memory a process took since counts.
            warm.check_wake_fits(ctx.ports.gpus, eng, sleepers=sleepers(ctx, but=[dep.model], reuse=True))
            ctx.emit("wake_fits", model=dep.model, gpus=list(dep.spec.gpus))
            return
        except GpuBusy:
            if clock.monotonic() >= deadline:
                raise
        ctx.pause(POLL_S)


def waking(ctx: StepContext, step: StepInput) -> None:
    """Wake the target and prove it with one completion within wake_deadline_s (else: wedged)."""
    dep = step.dep
    control = ctx.ports.engine_control_for(dep.spec)
    assert control is not None  # staging reports warm only with an engine control
    level = level_of(ctx, dep.model)
    note(ctx, "wake_started", model=dep.model, level=level)
    took = warm.wake_checked(
        control,
        ctx.ports.clock,
        engine_of(ctx, dep.spec, reuse=True),
        level=_level_number(dep.spec, level),
        deadline_s=deadline_of(ctx, dep.model),
    )
    note(ctx, "woken", model=dep.model, seconds=round(took, 3))
    mark(ctx, dep.model, SERVING, unit=dep.spec.unit_name)


def restarting(ctx: StepContext, step: StepInput) -> None:
    """A wedged engine only frees its memory when it dies: kill the unit's cgroup, wait until its
    GPUs hold nothing but sleepers' residue, start it cold (checking follows)."""
    spec = step.dep.spec
    sd = ctx.ports.systemd
    if beside(step):
        # Woken beside the serving engines, which still have the route: a cold restart would need the
        # GPUs they hold. The wedged engine goes; the failure leads to the set as it was (no gap).
        note(ctx, "stop_wedged", model=spec.model, unit=spec.unit_name)
        if sd.unit_state(spec.unit_name).is_active:
            sd.kill_unit(spec.unit_name, signal.SIGKILL)
        actions.stop_units(ctx, {spec.unit_name})
        mark(ctx, spec.model, STOPPED, unit=spec.unit_name)
        raise EngineWedged(
            f"{spec.model} wedged on its wake beside the serving engines: stopped; they keep serving",
            host=ctx.ports.host.name,
        )
    # The route leaves the engine while it restarts: clients get 503 + Retry-After, not a reset or
    # the starting engine's own 503s; `routing` brings it back once `checking` proved it serves.
    actions.route(ctx, [d.spec for d in step.kept], gaps=[spec.served_name])
    note(ctx, "restart_wedged", model=spec.model, unit=spec.unit_name)
    if sd.unit_state(spec.unit_name).is_active:
        sd.kill_unit(spec.unit_name, signal.SIGKILL)
    actions.stop_units(ctx, {spec.unit_name})
    mark(ctx, spec.model, STOPPED, unit=spec.unit_name)
    actions.free_gpus(ctx, spec.gpus, {spec.unit_name}, sleepers=sleeper_mib(ctx, but=[spec.model]))
    actions.start_unit(ctx, spec)


def woke_in(step: StepInput) -> bool:
    """Whether this deployment already woke (or began to wake) its target."""
    return any(p.get("step") == "wake_started" for p in step.warm_progress)


# -- rollback of a switch whose models sleep -------------------------------------------------------
def settle_target(ctx: StepContext, step: StepInput) -> None:
    """Rolling back: the target goes back to sleep when it served well enough to (warm), stays asleep
    when it was never woken, and stops otherwise (wedged, sleep failed, or no sleep mode)."""
    spec = step.dep.spec
    unit = spec.unit_name
    if not ctx.ports.systemd.unit_state(unit).is_active:
        mark(ctx, spec.model, STOPPED, unit=unit)
        return
    records = ctx.residency.residency(ctx.ports.host.name) if ctx.residency is not None else {}
    rec = records.get(spec.model)
    if rec is not None and rec.state == ASLEEP and not woke_in(step) and is_asleep(ctx, spec):
        # Never woken: it stays asleep, as before the switch. The route pointed at it since `sleeping`:
        # requests it holds would wait for a wake that never comes, so a wake (where it fits) and a
        # sleep (mode=wait) answer them first.
        if not beside(step) and step.dep.went_through(Phase.SLEEPING):
            flush_held(ctx, spec)
        return
    level, control = level_of(ctx, spec.model), ctx.ports.engine_control_for(spec)
    healthy = rec is not None and rec.state == SERVING
    if healthy and control is not None and level is not None:
        try:
            warm.sleep_verified(
                control,
                ctx.ports.gpus,
                ctx.ports.clock,
                engine_of(ctx, spec),
                level=_level_number(spec, level),
                residue_mib=residue_mib(ctx),
            )
            mark(ctx, spec.model, ASLEEP, level=level, unit=unit, weights_gib=weights_gib(ctx, spec))
            note(ctx, "slept", model=spec.model, level=level)
            return
        except (SleepLeftMemory, EngineError) as exc:
            note(ctx, "sleep_failed", model=spec.model, error=str(exc), then="stopped instead")
    if ctx.ports.systemd.unit_state(unit).is_active and not healthy:
        ctx.ports.systemd.kill_unit(unit, signal.SIGKILL)  # a wedged engine ignores a polite stop for long
    actions.stop_units(ctx, {unit})
    mark(ctx, spec.model, STOPPED, unit=unit)


def flush_held(ctx: StepContext, spec: UnitSpec) -> None:
    """Wake a sleeper the route pointed at, let what it held finish, put it back to sleep; where the
    memory is not there, it stays asleep and says so (its held requests wait for its next wake)."""
    control, level = ctx.ports.engine_control_for(spec), level_of(ctx, spec.model)
    if control is None or level is None:
        return
    eng = engine_of(ctx, spec)
    try:
        warm.check_wake_fits(ctx.ports.gpus, eng, sleepers=sleepers(ctx, but=[spec.model]))
        warm.wake_checked(
            control, ctx.ports.clock, eng, level=_level_number(spec, level), deadline_s=deadline_of(ctx, spec.model)
        )
        warm.sleep_verified(
            control,
            ctx.ports.gpus,
            ctx.ports.clock,
            eng,
            level=_level_number(spec, level),
            residue_mib=residue_mib(ctx),
        )
        note(ctx, "flushed", model=spec.model)
    except OrchestratorError as exc:
        note(ctx, "flush_failed", model=spec.model, error=str(exc), then="left asleep")


def wake_back(ctx: StepContext, old: Deployment) -> bool:
    """Rolling back to a model that sleeps: verify the memory, wake it, check it; a wedged wake
    restarts it cold. Returns False when ``old`` is not asleep (the caller starts it cold)."""
    spec = old.spec
    records = ctx.residency.residency(ctx.ports.host.name) if ctx.residency is not None else {}
    rec = records.get(old.model)
    # Recorded asleep but awake now: a rollback resumed after its wake; the completion still decides.
    resumed = (
        rec is not None
        and rec.state == ASLEEP
        and sleep_enabled(spec)
        and ctx.ports.systemd.unit_state(spec.unit_name).is_active
    )
    if not (resumed or is_asleep(ctx, spec)):
        return False
    control = ctx.ports.engine_control_for(spec)
    assert control is not None
    eng = engine_of(ctx, spec)
    clock = ctx.ports.clock
    deadline = clock.monotonic() + ctx.defaults.free_timeout_s
    while True:
        try:
            # The target counts as a sleeper when it is recorded asleep again (it keeps its residue).
            warm.check_wake_fits(ctx.ports.gpus, eng, sleepers=sleepers(ctx, but=[spec.model]))
            break
        except GpuBusy:
            if clock.monotonic() >= deadline:
                raise
        ctx.pause(0.2)
    try:
        took = warm.wake_checked(
            control,
            clock,
            eng,
            level=_level_number(spec, level_of(ctx, spec.model)),
            deadline_s=deadline_of(ctx, spec.model),
        )
        note(ctx, "woken", model=spec.model, seconds=round(took, 3))
    except OrchestratorError as exc:
        note(ctx, "wake_failed", model=spec.model, error=str(exc), then="restarted cold")
        ctx.ports.systemd.kill_unit(spec.unit_name, signal.SIGKILL)
        actions.stop_units(ctx, {spec.unit_name})
        actions.free_gpus(ctx, spec.gpus, {spec.unit_name}, sleepers=sleeper_mib(ctx, but=[spec.model]))
        actions.start_unit(ctx, spec)
        actions.wait_ready(ctx, spec)
    mark(ctx, spec.model, SERVING, unit=spec.unit_name)
    return True


def gpus_sleepers(ctx: StepContext, step: StepInput) -> Mapping[int, int]:
    """The free check of a cold switch: sleepers (not the target, not evicted) may keep their residue."""
    return sleeper_mib(ctx, but=[step.dep.model])
