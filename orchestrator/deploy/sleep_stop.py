"""Taking an engine out of service, one home each: ``stop_and_free`` (stop its unit, free its GPUs
verified by PID, record it stopped) and ``sleep_or_stop`` (sleep it, verified, and where it may not or
cannot sleep, stop and free it); ``put_to_sleep`` applies a switch's decision (deploy/fate.py) to the
engines it displaces with them. ``sleep_engine`` and ``wake_engine`` are the engine's sleep API with its
checks (deploy/warm.py) on one unit. Every caller's difference is a parameter here, not a copy:

=============================  =====================================================================
caller                         how
=============================  =====================================================================
a switch's displaced engines   put_to_sleep: sleep_or_stop per the fate, notes, no free (``freeing``
                               or the wake's own check reads the GPUs); evicted sleepers stop
rolling back the target        sleep_or_stop(sleep=healthy, kill=not healthy): warm_rollback.py
on demand's idle sleep         sleep_or_stop(free, disable, notes=False): deploy/demand_ops.py
a wedged wake                  stop_and_free(kill): warm_steps.restarting, warm_rollback.wake_back
``stop`` of a model            stop_and_free(disable, mark=False, or others_stay for a sleeper)
=============================  =====================================================================
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.core.records import Deployment, UnitSpec
from orchestrator.core.resident import ASLEEP, STOPPED
from orchestrator.deploy import actions, warm
from orchestrator.deploy.context import StepContext, StepInput
from orchestrator.deploy.fate import fate, recorded_fate
from orchestrator.deploy.residents import (
    deadline_of,
    engine_of,
    level_number,
    level_of,
    mark,
    note,
    residue_mib,
    sleeper_mib,
    weights_gib,
)
from orchestrator.errors import EngineError, SleepLeftMemory

_ANY_MIB = 1 << 40  # a process that may keep whatever it holds (free_gpus' allowance)


def stop_and_free(
    ctx: StepContext,
    model: str,
    unit: str,
    gpus: tuple[int, ...],
    *,
    kill: bool = False,
    free: bool = True,
    others_stay: bool = False,
    disable: bool = False,
    mark_stopped: bool = True,
) -> None:
    """Stop ``model``'s ``unit`` (idempotent: a stopped one stays so), then, each where asked:

    ``kill``: SIGKILL its cgroup first, while it runs (a wedged engine ignores a polite stop for long);
    ``free``: wait until ``gpus`` hold nothing of it (actions.free_gpus reaps what the stop left), the
    host's other sleepers keeping their residue, or with ``others_stay`` every process of another unit
    whatever it holds (a sleeper's stop: the model that displaced it serves there), read before the stop;
    ``disable``: it does not come back on reboot; ``mark_stopped``: recorded stopped (residency), last
    (a free that fails leaves the record as it was, and the caller's retry finds the model again)."""
    sd = ctx.ports.systemd
    others: dict[int, int] = {}
    if free and others_stay:
        own = set(sd.cgroup_pids(unit))
        others = {p.pid: _ANY_MIB for p in ctx.ports.gpus.snapshot().on(frozenset(gpus)) if p.pid not in own}
    if kill and sd.unit_state(unit).is_active:
        sd.kill_unit(unit, signal.SIGKILL)
    actions.stop_units(ctx, [unit])
    if free:
        actions.free_gpus(ctx, gpus, [unit], sleepers=others if others_stay else sleeper_mib(ctx, but=[model]))
    if disable and sd.unit_state(unit).exists:
        sd.disable(unit)
    if mark_stopped:
        mark(ctx, model, STOPPED, unit=unit)


def sleep_engine(ctx: StepContext, spec: UnitSpec, *, reuse: bool = False) -> float:
    """Sleep ``spec``'s engine at its model's level (mode=wait: what it serves finishes first) and read
    its GPUs by PID until only the residue is left (warm.sleep_verified); the seconds it took. Raises
    EngineError (no control, the API erred) or SleepLeftMemory. ``reuse``: its PIDs as read earlier in
    this run (the warm window reads no unit)."""
    control = ctx.ports.engine_control_for(spec)
    if control is None:
        raise EngineError(f"host {ctx.ports.host.name} has no engine control port for {spec.unit_name}")
    return warm.sleep_verified(
        control,
        ctx.ports.gpus,
        ctx.ports.clock,
        engine_of(ctx, spec, reuse=reuse),
        level=level_number(spec, level_of(ctx, spec.model)),
        residue_mib=residue_mib(ctx),
    )


def wake_engine(ctx: StepContext, spec: UnitSpec, *, reuse: bool = False) -> float:
    """Wake ``spec``'s engine and prove it with one completion within its wake deadline
    (warm.wake_checked; else EngineWedged); the seconds it took. The caller checked the memory."""
    control = ctx.ports.engine_control_for(spec)
    assert control is not None  # only an engine that sleeps is woken
    return warm.wake_checked(
        control,
        ctx.ports.clock,
        engine_of(ctx, spec, reuse=reuse),
        level=level_number(spec, level_of(ctx, spec.model)),
        deadline_s=deadline_of(ctx, spec.model),
    )


@dataclass(frozen=True)
class Left:
    """How ``sleep_or_stop`` left an engine: asleep (with the sleep's seconds) or stopped (with why its
    sleep failed, when one was tried)."""

    asleep: bool
    seconds: float = 0.0
    sleep_failed: str | None = None


def sleep_or_stop(
    ctx: StepContext,
    spec: UnitSpec,
    *,
    sleep: bool,
    why: str | None = None,
    reuse: bool = False,
    weights: float | None = None,
    kill: bool = False,
    free: bool = False,
    disable: bool = False,
    notes: bool = True,
) -> Left:
    """Put ``spec``'s running engine to sleep when ``sleep`` (the decision lets it) and its model has a
    sleep level and its engine a control: verified (``sleep_engine``), recorded asleep with its weights'
    GiB (``weights``, else ``du``). A sleep that errs or keeps its memory, or one not asked or not
    possible, stops it instead (``stop_and_free`` with ``kill``, ``free``, ``disable``).

    ``notes``: a deployment's step keeps what happened with the deployment and shows it ("slept",
    "sleep_failed", and "stopping" with ``why`` where no sleep was tried and ``why`` is given); the
    agent's idle job records one event of its own instead. ``reuse``: inside the warm window."""
    model, unit = spec.model, spec.unit_name
    level, control = level_of(ctx, model), ctx.ports.engine_control_for(spec)
    failed = None
    if sleep and control is not None and level is not None:
        try:
            took = sleep_engine(ctx, spec, reuse=reuse)
            size = weights_gib(ctx, spec) if weights is None else weights
            mark(ctx, model, ASLEEP, level=level, unit=unit, weights_gib=size)
            if notes:
                note(ctx, "slept", model=model, level=level, seconds=round(took, 3))
            return Left(True, seconds=took)
        except (SleepLeftMemory, EngineError) as exc:
            failed = str(exc)
            if notes:
                note(ctx, "sleep_failed", model=model, error=failed, then="stopped instead")
    elif notes and why is not None:
        note(ctx, "stopping", model=model, reason=why)
    stop_and_free(ctx, model, unit, spec.gpus, kill=kill, free=free, disable=disable)
    return Left(False, sleep_failed=failed)


def gone(ctx: StepContext, spec: UnitSpec) -> bool:
    """The engine's unit no longer runs: recorded stopped (observed, whatever the records said)."""
    if ctx.ports.systemd.unit_state(spec.unit_name).is_active:
        return False
    mark(ctx, spec.model, STOPPED, unit=spec.unit_name)
    return True


def put_to_sleep(ctx: StepContext, step: StepInput, leaving: Iterable[Deployment], *, window: bool = False) -> set[str]:
    """Sleep (mode=wait) or stop each displaced engine as the decision says, evict what it names;
    returns the units that now sleep. A sleep that errs or keeps its memory stops that engine.
    ``window``: a warm switch's, with the route on its target: reuse what staging read."""
    decided = recorded_fate(step) or fate(ctx, step)
    asleep: set[str] = set()
    for d in leaving:
        if gone(ctx, d.spec):
            continue
        left = sleep_or_stop(
            ctx,
            d.spec,
            sleep=d.model in decided.sleep,
            why=decided.reason(d.model, "no sleep mode"),
            reuse=window,
            weights=decided.weights.get(d.model),
            free=False,
        )
        if left.asleep:
            asleep.add(d.spec.unit_name)
    for name in decided.evict:
        model = ctx.catalog.models[name]
        note(ctx, "evicted", model=name, reason=decided.reason(name))
        stop_and_free(ctx, name, model.unit_name, model.gpus, free=False)
    return asleep
