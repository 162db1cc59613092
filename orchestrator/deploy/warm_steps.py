"""The warm path's steps (see core/states.py's table): sleeping, verifying, waking, restarting.

Every step observes first (the unit, ``/is_sleeping``, nvidia-smi by PID) so that a run resumed
after a crash finishes what the killed one began. What an engine said when it failed (a sleep that
kept its memory, a wedged wake) is recorded as an event with the deployment and in the progress.
What a switch does to the other models is deploy/fate.py, how an engine sleeps or stops
deploy/sleep_stop.py, and the rollback of a warm switch deploy/warm_rollback.py.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.core.records import Deployment, Mode, UnitSpec
from orchestrator.core.resident import SERVING
from orchestrator.deploy import actions, warm
from orchestrator.deploy.context import StepContext, StepInput
from orchestrator.deploy.residents import (
    WARM_EVENT,
    engine_of,
    level_of,
    mark,
    note,
    on_demand,
    residue_mib,
    sleepers,
    unit_pids,
)
from orchestrator.deploy.sleep_stop import put_to_sleep, stop_and_free, wake_engine
from orchestrator.deploy.warm import POLL_S, sleep_enabled
from orchestrator.errors import EngineWedged, GpuBusy


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
    # does at once. Where the displaced names are on demand too (their backends stay, every server
    # disabled) that is a runtime move to the config of what stays, file and hash with it, so the
    # route to the target in `routing` is a runtime move as well; else the engines are withdrawn and
    # `routing` reloads, past the held requests' wait.
    kept = [d.spec for d in step.kept]
    withdrew = on_demand(ctx, dep.model) and (
        not leaving or actions.move_route(ctx, kept) or actions.withdraw(ctx, (d.spec for d in leaving))
    )
    if not withdrew:
        actions.route(ctx, [*kept, dep.spec])
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
    assert ctx.ports.engine_control_for(dep.spec) is not None  # staging reports warm only with an engine control
    note(ctx, "wake_started", model=dep.model, level=level_of(ctx, dep.model))
    took = wake_engine(ctx, dep.spec, reuse=True)
    note(ctx, "woken", model=dep.model, seconds=round(took, 3))
    mark(ctx, dep.model, SERVING, unit=dep.spec.unit_name)


def restarting(ctx: StepContext, step: StepInput) -> None:
    """A wedged engine only frees its memory when it dies: kill the unit's cgroup, wait until its
    GPUs hold nothing but sleepers' residue, start it cold (checking follows)."""
    spec = step.dep.spec
    if beside(step):
        # Woken beside the serving engines, which still have the route: a cold restart would need the
        # GPUs they hold. The wedged engine goes; the failure leads to the set as it was (no gap).
        note(ctx, "stop_wedged", model=spec.model, unit=spec.unit_name)
        stop_and_free(ctx, spec.model, spec.unit_name, spec.gpus, kill=True, free=False)
        raise EngineWedged(
            f"{spec.model} wedged on its wake beside the serving engines: stopped; they keep serving",
            host=ctx.ports.host.name,
        )
    # The route leaves the engine while it restarts: clients get 503 + Retry-After, not a reset or
    # the starting engine's own 503s; `routing` brings it back once `checking` proved it serves.
    actions.route(ctx, [d.spec for d in step.kept], gaps=[spec.served_name])
    note(ctx, "restart_wedged", model=spec.model, unit=spec.unit_name)
    stop_and_free(ctx, spec.model, spec.unit_name, spec.gpus, kill=True)
    actions.start_unit(ctx, spec)


def woke_in(step: StepInput) -> bool:
    """Whether this deployment already woke (or began to wake) its target."""
    return any(p.get("step") == "wake_started" for p in step.warm_progress)
