"""The steps of a deployment, as data: one function per phase, in ``STEPS``.

A step reads its StepInput, acts on the host through the StepContext's ports (idempotently:
observe first, act on the difference), and returns a StepResult the engine persists before the
next phase. Adding a phase (routing traffic through a proxy, say) is one entry in
``core/states.py``'s table and one function here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from orchestrator.core.records import Deployment, UnitSpec
from orchestrator.core.resident import SERVING
from orchestrator.core.states import Event, Phase
from orchestrator.deploy import actions, adopt, fate, multinode, residents, sleep_stop, warm_rollback, warm_steps
from orchestrator.deploy.beside import room_beside
from orchestrator.deploy.context import DONE, StepContext, StepInput, StepResult
from orchestrator.deploy.preflight import check_access, check_layout, port_holder
from orchestrator.deploy.warm_steps import beside
from orchestrator.errors import GpuBusy, PlanError, SmokeGateFailed, SystemdError

Step = Callable[[StepContext, StepInput], StepResult]


def planned(ctx: StepContext, step: StepInput) -> StepResult:
    return DONE


def preflight(ctx: StepContext, step: StepInput) -> StepResult:
    dep = step.dep
    on_demand = dep.model in ctx.catalog.models and ctx.catalog.models[dep.model].on_demand
    served = {d.spec.served_name for d in step.serving}
    if step.plan is not None and not on_demand and dep.spec.served_name not in served:
        # A name nothing serves answers "loading" (503 + Retry-After) from the switch's first step
        # (the checks and the download included), not "not loaded"; a switch that ends before
        # stopping anything takes the mark back (engine). An on-demand model's requests are held
        # (the proxy's demand hold) until it serves: it never gets the mark (core.proxy), so no apply.
        actions.route(ctx, (d.spec for d in step.serving), loading=[dep.spec.served_name])
    snap = ctx.ports.gpus.snapshot()
    state = ctx.ports.systemd.unit_state(dep.spec.unit_name)
    ctx.emit("preflight", gpus=len(snap.gpus), unit_state=state.active_state)
    missing = sorted(set(dep.spec.gpus) - {g.index for g in snap.gpus})
    if missing:
        raise PlanError(
            f"{dep.model} needs GPU {','.join(map(str, dep.spec.gpus))} but nvidia-smi shows "
            f"{len(snap.gpus)} GPU(s): {','.join(str(g.index) for g in snap.gpus) or 'none'}",
            host=dep.host,
        )
    # A level-1 sleeper under this very unit loaded with it and holds its port: its wake starts no process
    # and reads no file, so what a start needs (access, layout, a free port) was proven as it loaded; on
    # demand these checks would be inside the held requests' wait.
    loaded = _asleep_as_loaded(ctx, step)
    checked = (dep.model, dep.spec.model_dir) in ctx.access_checked  # by the switch, before it recorded dep
    if dep.model in ctx.catalog.models and dep.restores is None and not (loaded or checked):  # ran here before
        check_access(ctx.catalog, dep.model, ctx.ports, dep.spec.model_dir)
    if not loaded:
        check_layout(ctx.catalog, dep, ctx.ports, snap)
        # What this switch stops first may hold the port now: an adopted unit of any name, a hand-run engine.
        taken = port_holder(
            ctx.ports.shell,
            dep.model,
            dep.spec.address,
            dep.spec.port,
            units=step.units_to_stop,
            pids=[d.spec.pid for d in _replaced(step) if d.spec.pid is not None],
        )
        if taken is not None:
            raise PlanError(taken, host=dep.host)
    if ctx.ports.proxy is not None:
        holder = ctx.ports.proxy.port_holder()
        if holder is not None:
            raise PlanError(holder, host=dep.host)
    if dep.spec.nodes:
        multinode.preflight(ctx, dep.spec)
    return DONE


def _replaced(step: StepInput) -> list[Deployment]:
    """The serving deployments whose engines this switch stops before it starts its own (none beside)."""
    if step.plan is None:
        return [step.previous] if step.previous is not None else []
    return [] if beside(step) else list(step.overlapping)


def staging(ctx: StepContext, step: StepInput) -> StepResult:
    """Stage and verify weights, then write and load the new unit: all while the old model serves."""
    dep, store = step.dep, ctx.ports.weights
    spec = None
    loaded = _asleep_as_loaded(ctx, step)
    if loaded:
        ctx.emit("weights_in_ram", model=dep.model)
    if dep.spec.source != "none" and store is not None and not loaded:
        staged = store.stage(dep.spec, ctx.progress)
        ctx.emit("staged", path=staged.path, revision=staged.revision, bytes=staged.total_bytes)
        # A rollback redeploys its recorded spec exactly; a switch follows where the weights landed.
        if staged.path != dep.spec.model_dir and dep.restores is None:
            spec = step.respec(staged.path, staged.revision)
        check_layout(ctx.catalog, replace(dep, spec=spec or dep.spec), ctx.ports, ctx.ports.gpus.snapshot())
    multinode.stage(ctx, spec or dep.spec)
    multinode.preinstall(ctx, spec or dep.spec)
    _preinstall(ctx, spec or dep.spec)
    target = spec or dep.spec
    if beside(step):
        check_beside(ctx, step, target)  # before anything changes: a stale count aborts, nothing stopped
    # Asleep with its unit unchanged: the table's warm path wakes it instead of starting it.
    # (``loaded`` said so already for this very unit: no second read of it and of /is_sleeping.)
    if step.plan is not None and (
        loaded
        or (ctx.ports.systemd.read_unit(target.unit_name) == target.unit_text and residents.is_asleep(ctx, target))
    ):
        if not beside(step):
            warm_steps.check_wake_first(ctx, step, target)
            if ctx.residency is not None:
                fate.decide(ctx, step)
        ctx.emit("warm", model=dep.model)
        return StepResult(spec=spec, event=Event.WARM)
    return StepResult(spec=spec)


def _asleep_as_loaded(ctx: StepContext, step: StepInput) -> bool:
    """The target sleeps at level 1 under this very unit: its weights are in host RAM as it loaded them, and
    its wake reads no file; staging them again would only put a verification of files into the wait of
    what asks for it (an on-demand request waits from the swap's first step)."""
    return step.plan is not None and residents.loaded_asleep(ctx.ports, ctx.catalog, step.dep.spec)


def check_beside(ctx: StepContext, step: StepInput, target: UnitSpec) -> None:
    """GpuBusy unless ``target`` fits beside every engine that serves now, counted as planned."""
    fit = room_beside(ctx.ports, ctx.catalog, ctx.residency, target, (d.spec for d in step.serving))
    if not fit.fits:
        raise GpuBusy(
            f"{target.model} no longer fits beside what serves, so nothing was stopped: {fit.text()}; "
            "switch again to plan a stop-start",
            host=ctx.ports.host.name,
        )
    residents.note(ctx, "beside", model=target.model, gpus=[r.text() for r in fit.rooms])


def _wait_beside(ctx: StepContext, step: StepInput) -> None:
    """Beside: nothing was freed for the target; wait (free_timeout_s) until it fits beside again."""
    clock = ctx.ports.clock
    deadline = clock.monotonic() + ctx.defaults.free_timeout_s
    while True:
        fit = room_beside(ctx.ports, ctx.catalog, ctx.residency, step.dep.spec, (d.spec for d in step.serving))
        if fit.fits:
            ctx.emit("beside_fits", model=step.dep.model, gpus=list(step.dep.spec.gpus))
            return
        if clock.monotonic() >= deadline:
            raise GpuBusy(
                f"{step.dep.model} does not fit beside what serves {ctx.defaults.free_timeout_s:g} s "
                f"after the stop: {fit.text()}",
                host=ctx.ports.host.name,
            )
        ctx.pause(min(0.2, ctx.defaults.health_interval_s))


def _preinstall(ctx: StepContext, spec: UnitSpec) -> None:
    """A unit that is not running yet needs no GPU: writing and loading it now takes a file write
    and a daemon-reload out of the downtime, and an invalid unit aborts before anything stops."""
    sd = ctx.ports.systemd
    if sd.unit_state(spec.unit_name).is_active:
        return
    try:
        actions.install_unit(ctx, spec)
    except SystemdError:
        sd.remove_unit(spec.unit_name)  # leave no broken file behind
        sd.daemon_reload()
        raise


def stopping(ctx: StepContext, step: StepInput) -> StepResult:
    # Names whose engine stops now answer 503 + Retry-After until the switch ends, and so does the
    # target's name when nothing served it ("loading", not 404); requests the previous proxy config
    # already sent to that engine finish before it stops (a resumed step drains too: the route may
    # have moved just before a crash).
    units = step.units_to_stop
    if beside(step):
        # The displaced engines keep serving: only what is neither serving nor asleep stops here.
        units = units - residents.asleep_units(ctx, but=[step.dep.model])
    elif step.plan is not None:
        actions.route(
            ctx,
            (d.spec for d in step.serving),
            gaps=(d.spec.served_name for d in step.overlapping),
            loading=[step.dep.spec.served_name],
        )
        actions.drain(ctx, (d.spec for d in step.serving if d.spec.unit_name in step.units_to_stop))
        # Those that can sleep sleep (mode=wait, after the drain); sleepers stay unless evicted.
        leaving = [d for d in step.overlapping if d.spec.unit_name != step.dep.spec.unit_name]
        asleep = sleep_stop.put_to_sleep(ctx, step, leaving) if ctx.residency is not None else set()
        units = units - asleep - residents.asleep_units(ctx, but=[step.dep.model])
    # An engine adopted as a hand-run process has no unit to stop: its process goes (freeing verifies its GPUs).
    adopt.stop_processes(ctx, (d.spec for d in _replaced(step) if d.spec.unit_name in units))
    actions.stop_units(ctx, units)
    multinode.stop(ctx, step.node_units_to_stop)  # the other nodes after the API, in reverse start order
    return DONE


def freeing(ctx: StepContext, step: StepInput) -> StepResult:
    if beside(step):
        _wait_beside(ctx, step)
        return DONE
    actions.free_gpus(
        ctx,
        step.dep.spec.gpus,
        step.units_to_stop - residents.asleep_units(ctx, but=[step.dep.model]),
        sleepers=residents.sleeper_mib(ctx, but=[step.dep.model]),
    )
    multinode.free(ctx, step.dep.spec, step.node_units_to_stop)
    return DONE


def installing(ctx: StepContext, step: StepInput) -> StepResult:
    multinode.install(ctx, step.dep.spec)
    actions.install_unit(ctx, step.dep.spec)
    multinode.api_progress(ctx, step.dep.spec, "installed")
    return DONE


def starting(ctx: StepContext, step: StepInput) -> StepResult:
    multinode.start(ctx, step.dep.spec)  # headless ranks, or the Ray head and workers, first
    actions.start_unit(ctx, step.dep.spec)
    multinode.api_progress(ctx, step.dep.spec, "started")
    return DONE


def checking(ctx: StepContext, step: StepInput) -> StepResult:
    """Health, models, one real completion; then the optional smoke benchmark and its gate."""
    multinode.wait_ready(ctx, step.dep.spec)
    bench = _smoke_gate(ctx, step)
    others = ctx.managed_units if step.plan is None else {d.spec.unit_name for d in step.displaced}
    actions.settle_enablement(ctx, step.dep.spec.unit_name, others)
    multinode.settle(ctx, step.dep.spec, step.node_units_to_stop)
    return StepResult(bench=bench)


def routing(ctx: StepContext, step: StepInput) -> StepResult:
    """Move the routes to the serving set with the new model in it, then drain and stop what it
    replaced (a handover: the old engine served until the route moved). Without a proxy: nothing."""
    if step.plan is None:
        return DONE
    dep = step.dep
    actions.route(ctx, [*(d.spec for d in step.kept), dep.spec])
    if beside(step):
        _leave_beside(ctx, step)
        return DONE
    leaving = {d.spec.unit_name for d in step.displaced} - {dep.spec.unit_name}
    leaving -= residents.asleep_units(ctx, but=[dep.model])  # a warm switch's displaced engines sleep
    running = [u for u in sorted(leaving) if ctx.ports.systemd.unit_state(u).is_active]
    adopt.stop_processes(ctx, (d.spec for d in step.displaced if d.spec.unit_name in leaving))
    if running:
        actions.drain(ctx, (d.spec for d in step.displaced if d.spec.unit_name in running))
    for d in step.displaced:
        if d.spec.unit_name in running:  # a handover: nothing waits for the GPUs it leaves
            sleep_stop.stop_and_free(ctx, d.model, d.spec.unit_name, d.spec.gpus, free=False)
    residents.mark(ctx, dep.model, SERVING, unit=dep.spec.unit_name)
    return DONE


def _leave_beside(ctx: StepContext, step: StepInput) -> None:
    """Beside, once the route moved: the displaced engines drain, then sleep (sleep mode and the RAM
    budget allow) or stop; one that slept already (a resumed run) stays asleep."""
    dep = step.dep
    asleep = residents.asleep_units(ctx, but=[dep.model])
    leaving = [d for d in step.displaced if d.spec.unit_name not in asleep | {dep.spec.unit_name}]
    running = [d for d in leaving if ctx.ports.systemd.unit_state(d.spec.unit_name).is_active]
    actions.drain(ctx, (d.spec for d in running))
    adopt.stop_processes(ctx, (d.spec for d in leaving))  # a hand-run engine cannot sleep through the product
    if ctx.residency is not None:
        sleep_stop.put_to_sleep(ctx, step, leaving)
    else:
        for d in running:
            sleep_stop.stop_and_free(ctx, d.model, d.spec.unit_name, d.spec.gpus, free=False)
    residents.mark(ctx, dep.model, SERVING, unit=dep.spec.unit_name)


def _smoke_gate(ctx: StepContext, step: StepInput) -> dict[str, object] | None:
    """With a gate, a revision slower than the previous one fails like a health check; the error
    carries the record so the engine persists it with the failure."""
    policy, smoke, dep = ctx.catalog.policy, ctx.ports.smoke, step.dep
    if not policy.smoke_bench or smoke is None:
        return None
    record = smoke.run(dep.spec)
    ctx.emit("smoke_bench", tok_s=record.get("headline_tok_s"))
    new = record.get("headline_tok_s")
    if policy.min_tok_s_ratio is None or step.previous is None:
        return record
    old = (step.previous.bench or {}).get("headline_tok_s")
    if old and (new is None or new < policy.min_tok_s_ratio * old):
        raise SmokeGateFailed(
            f"{dep.spec.unit_name}: single-stream {0.0 if new is None else new:.1f} tok/s is below "
            f"{policy.min_tok_s_ratio:g} x {old:.1f} tok/s of revision {step.previous.revision} "
            f"({step.previous.model})",
            host=dep.host,
            unit=dep.spec.unit_name,
            bench=record,
        )
    return record


def rolling_back(ctx: StepContext, step: StepInput) -> StepResult:
    """The previous stable revision's exact recorded unit, through the same actions."""
    if step.plan is not None:
        return _restore_set(ctx, step)
    dep, previous = step.dep, step.previous
    assert previous is not None  # the table only enters rolling_back with one
    prev = previous.spec
    ctx.emit("rollback", to_revision=previous.revision, model=prev.model)
    # Resumed after a crash: the old model's units this phase already started stay up.
    keep = multinode.resumed(ctx, prev, step.node_progress, Phase.ROLLING_BACK.value)
    api_kept = (ctx.ports.host.name, prev.unit_name) in keep
    units = step.units_to_stop | {dep.spec.unit_name}
    actions.stop_units(ctx, units - {prev.unit_name} if prev.unit_name != dep.spec.unit_name or api_kept else units)
    multinode.stop(ctx, step.node_units_to_stop, keep)  # the new model on every node, the old one's too
    if not api_kept:
        actions.free_gpus(ctx, prev.gpus, units - {prev.unit_name})
    multinode.free(ctx, prev, step.node_units_to_stop, keep)
    multinode.install(ctx, prev)
    multinode.start(ctx, prev)
    actions.install_unit(ctx, prev)
    actions.start_unit(ctx, prev)
    multinode.api_progress(ctx, prev, "started")
    multinode.wait_ready(ctx, prev)
    actions.settle_enablement(ctx, prev.unit_name, ctx.managed_units | {dep.spec.unit_name})
    multinode.settle(ctx, prev, step.node_units_to_stop)
    multinode.restore_peers(ctx, step.peer_restore)
    return DONE


def _restore_set(ctx: StepContext, step: StepInput) -> StepResult:
    """With the proxy: bring back the serving set as it was before the switch, routes included."""
    dep = step.dep
    restore = step.displaced
    ctx.emit("rollback", to_set=[d.model for d in step.serving])
    # A name whose engine is not awake (stopped, asleep, not answering) answers 503 + Retry-After until
    # it is back, and stays so when it cannot come back: never a route to a sleeper, where requests hang.
    actions.route(
        ctx,
        (d.spec for d in step.serving),
        gaps=(d.spec.served_name for d in restore if not residents.awake(ctx, d.spec)),
    )
    # The target sleeps again (warm), stays asleep if never woken, or stops; then the set comes back.
    warm_rollback.settle_target(ctx, step)
    for old in restore:
        if warm_rollback.wake_back(ctx, old):
            actions.settle_enablement(ctx, old.spec.unit_name, set())
            continue
        if ctx.ports.systemd.unit_state(old.spec.unit_name).is_active:
            continue  # a handover's old engine still serves
        actions.free_gpus(
            ctx, old.spec.gpus, {dep.spec.unit_name}, sleepers=residents.sleeper_mib(ctx, but=[old.model])
        )
        actions.install_unit(ctx, old.spec)
        actions.start_unit(ctx, old.spec)
        actions.wait_ready(ctx, old.spec)
        residents.mark(ctx, old.model, SERVING, unit=old.spec.unit_name)
        actions.settle_enablement(ctx, old.spec.unit_name, set())
    actions.route(ctx, (d.spec for d in step.serving))
    if (
        dep.spec.unit_name not in {d.spec.unit_name for d in step.serving}
        and ctx.ports.systemd.unit_state(dep.spec.unit_name).exists
    ):
        ctx.ports.systemd.disable(dep.spec.unit_name)
    return DONE


def _done(act: Callable[[StepContext, StepInput], None]) -> Step:
    def step(ctx: StepContext, inp: StepInput) -> StepResult:
        act(ctx, inp)
        return DONE

    step.__name__ = act.__name__
    return step


STEPS: dict[Phase, Step] = {
    Phase.PLANNED: planned,
    Phase.PREFLIGHT: preflight,
    Phase.STAGING: staging,
    Phase.STOPPING: stopping,
    Phase.FREEING: freeing,
    Phase.INSTALLING: installing,
    Phase.STARTING: starting,
    Phase.CHECKING: checking,
    Phase.ROUTING: routing,
    Phase.SLEEPING: _done(warm_steps.sleeping),
    Phase.VERIFYING: _done(warm_steps.verifying),
    Phase.WAKING: _done(warm_steps.waking),
    Phase.RESTARTING: _done(warm_steps.restarting),
    Phase.ROLLING_BACK: rolling_back,
}
