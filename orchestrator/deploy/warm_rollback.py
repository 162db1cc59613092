"""Rolling back a switch whose models sleep (steps.rolling_back, with the front proxy): the target
goes back to sleep, stays asleep or stops (``settle_target``), a sleeper the route pointed at answers
what it held (``flush_held``), and a displaced model that sleeps is woken back (``wake_back``).
"""

from __future__ import annotations

from orchestrator.core.records import Deployment, UnitSpec
from orchestrator.core.resident import ASLEEP, SERVING
from orchestrator.core.states import Phase
from orchestrator.deploy import actions, warm
from orchestrator.deploy.context import StepContext, StepInput
from orchestrator.deploy.residents import engine_of, is_asleep, level_of, mark, note, sleepers
from orchestrator.deploy.sleep_stop import gone, sleep_engine, sleep_or_stop, stop_and_free, wake_engine
from orchestrator.deploy.warm import sleep_enabled
from orchestrator.deploy.warm_steps import beside, woke_in
from orchestrator.errors import GpuBusy, OrchestratorError


def settle_target(ctx: StepContext, step: StepInput) -> None:
    """Rolling back: the target goes back to sleep when it served well enough to (warm), stays asleep
    when it was never woken, and stops otherwise (wedged, sleep failed, or no sleep mode)."""
    spec = step.dep.spec
    if gone(ctx, spec):
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
    healthy = rec is not None and rec.state == SERVING
    # A wedged engine ignores a polite stop for long: killed first.
    sleep_or_stop(ctx, spec, sleep=healthy, kill=not healthy)


def flush_held(ctx: StepContext, spec: UnitSpec) -> None:
    """Wake a sleeper the route pointed at, let what it held finish, put it back to sleep; where the
    memory is not there, it stays asleep and says so (its held requests wait for its next wake)."""
    if ctx.ports.engine_control_for(spec) is None or level_of(ctx, spec.model) is None:
        return
    eng = engine_of(ctx, spec)
    try:
        warm.check_wake_fits(ctx.ports.gpus, eng, sleepers=sleepers(ctx, but=[spec.model]))
        wake_engine(ctx, spec, reuse=True)
        sleep_engine(ctx, spec, reuse=True)
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
    assert ctx.ports.engine_control_for(spec) is not None
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
        took = wake_engine(ctx, spec, reuse=True)
        note(ctx, "woken", model=spec.model, seconds=round(took, 3))
    except OrchestratorError as exc:
        note(ctx, "wake_failed", model=spec.model, error=str(exc), then="restarted cold")
        stop_and_free(ctx, spec.model, spec.unit_name, spec.gpus, kill=True, mark_stopped=False)
        actions.start_unit(ctx, spec)
        actions.wait_ready(ctx, spec)
    mark(ctx, spec.model, SERVING, unit=spec.unit_name)
    return True
