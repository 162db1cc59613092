"""The agent's own box operations for models on demand and the front proxy, each declared in the
operation table (contract/ops.py: demand_sleep, demand_stop, reroute, proxy_up, proxy_off,
leftover_proxy_off; no client may ask them) and run through it by the agent.

The idle half of models on demand: put an idle serving model to sleep (route away, drain, sleep
mode=wait, verify its GPUs by PID) and stop an idle sleeper (its memory verified free). Each holds the
host's lock like every other operation and is recorded as an event. A push that changes what the proxy
holds for re-renders it (reroute), nothing switched; one that turns the proxy off stops it (proxy_off),
and so does an agent that starts from a file with the proxy off while the host's proxy unit is still up
from before (leftover_proxy_off); one that starts with it on brings it up (proxy_up).
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.proxy import PROXY_UNIT
from orchestrator.core.records import ServingChange
from orchestrator.core.resident import ASLEEP, STOPPED
from orchestrator.deploy import actions, warm
from orchestrator.deploy.context import StepContext
from orchestrator.deploy.locks import host_lock
from orchestrator.deploy.operations import Operations
from orchestrator.deploy.warm_steps import engine_of, mark, residue_mib, sleeper_mib, weights_gib
from orchestrator.engines import engine_named
from orchestrator.errors import EngineError, SleepLeftMemory, UsageError
from orchestrator.ports import ProgressCallback


def _ctx(ops: Operations, host: str, progress: ProgressCallback | None, **bound: Any) -> StepContext:
    return StepContext(
        ports=ops.ports_for(host),
        catalog=ops.catalog,
        progress=progress or (lambda e, f: None),
        bound={"host": host, **bound},
        residency=ops.residency,
    )


def sleep_idle(ops: Operations, model: str, *, reason: str, progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Put serving ``model`` to sleep: the route goes first (its requests are then held by the proxy
    for the agent), in-flight requests finish, then the engine sleeps and its GPUs are read. A sleep
    that errs or keeps its memory stops the engine instead."""
    host = ops.catalog.target(model=model).name
    level = ops.catalog.models[model].sleep
    with host_lock(ops.state_dir, host, ops.holder(host)):
        serving = ops.store.serving_set(host)
        dep = next((d for d in serving if d.model == model), None)
        if dep is None:
            raise UsageError(f"{model} does not serve on {host}: nothing to put to sleep")
        if level is None or not warm.sleep_enabled(dep.spec):
            raise UsageError(f"{model} has no sleep mode: it can only be stopped")
        ctx = _ctx(ops, host, progress, revision=dep.revision)
        rest = [d for d in serving if d.revision != dep.revision]
        actions.route(ctx, [d.spec for d in rest])
        actions.drain(ctx, [dep.spec])
        _leave_set(ops, host, dep.revision, [d.revision for d in rest])
        outcome = "asleep"
        try:
            control = ctx.ports.engine_control_for(dep.spec)
            if control is None:
                raise EngineError(f"host {host} has no engine control port")
            took = warm.sleep_verified(
                control,
                ctx.ports.gpus,
                ctx.ports.clock,
                engine_of(ctx, dep.spec),
                level=engine_named(dep.spec.engine).sleep_level(level),
                residue_mib=residue_mib(ctx),
            )
            mark(ctx, model, ASLEEP, level=level, unit=dep.spec.unit_name, weights_gib=weights_gib(ctx, dep.spec))
            detail: dict[str, Any] = {"seconds": round(took, 3)}
        except (SleepLeftMemory, EngineError) as exc:
            _stop_verified(ctx, model, dep.spec.unit_name, dep.spec.gpus)
            outcome, detail = "stopped", {"sleep_failed": str(exc)}
        ops.record_event(
            ctx.ports.clock.now(),
            host,
            "demand_idle",
            {"model": model, "outcome": outcome, "reason": reason, "revision": dep.revision, **detail},
        )
        return {"host": host, "model": model, "outcome": outcome, "reason": reason, **detail}


def stop_idle(ops: Operations, model: str, *, reason: str, progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Stop idle ``model`` as `stop` does: a serving one (route, drain, stop, free), or a sleeper (its
    unit, then its GPUs verified free of its processes; a model serving there stays)."""
    host = ops.catalog.target(model=model).name
    result = ops.stop(model, progress=progress)
    ops.record_event(
        ops.ports_for(host).clock.now(), host, "demand_idle", {"model": model, "outcome": "stopped", "reason": reason}
    )
    return {**result, "reason": reason}


def reroute(ops: Operations, host: str, *, reason: str) -> bool:
    """Render ``host``'s proxy config again for what serves now and apply it (the graceful reload every
    switch uses: no served stream is cut); True when the proxy reloaded. Under the host's lock (Busy
    otherwise); a host whose last deployment did not finish is left to its recovery, which routes it."""
    with host_lock(ops.state_dir, host, ops.holder(host)):
        if ops.unfinished(host):
            return False
        ctx = _ctx(ops, host, None)
        changed = actions.route(ctx, [d.spec for d in ops.store.serving_set(host)])
    ops.record_event(ctx.ports.clock.now(), host, "demand_route", {"reason": reason, "reloaded": changed})
    return changed


def proxy_up(ops: Operations, host: str, *, reason: str) -> bool:
    """``host``'s front proxy up, routing what serves now: started where it was not (before a box's
    first switch nothing else starts it, and a client would find nothing listening; the catalog's
    names answer 503 "not loaded" then, other names 404). Under the host's lock (Busy otherwise); a
    host whose last deployment did not finish is left to its recovery, which routes it. True when the
    proxy started or reloaded (then recorded as an event)."""
    with host_lock(ops.state_dir, host, ops.holder(host)):
        if ops.ports_for(host).proxy is None or ops.unfinished(host):
            return False
        ctx = _ctx(ops, host, None)
        changed = actions.route(ctx, [d.spec for d in ops.store.serving_set(host)])
    if changed:
        ops.record_event(ctx.ports.clock.now(), host, "proxy_up", {"reason": reason})
    return changed


def proxy_off(ops: Operations, host: str, *, reason: str) -> bool:
    """Stop and disable ``host``'s front proxy (a push set [proxy] enabled = false): ``ops`` are the
    ones of the catalog it was enabled in, which have its port. Under the host's lock (Busy otherwise),
    recorded as an event; True when it was running."""
    with host_lock(ops.state_dir, host, ops.holder(host)):
        ports = ops.ports_for(host)
        stopped = ports.proxy.stop() if ports.proxy is not None else False
    ops.record_event(ports.clock.now(), host, "proxy_stopped", {"reason": reason, "was_running": stopped})
    return stopped


def leftover_proxy_off(ops: Operations, host: str, *, reason: str) -> str | None:
    """``host``'s [proxy] is off, yet its orchestrator-proxy.service may still run or be enabled (the
    file was edited and the agent restarted: no push stopped it). Stop and disable that unit, as a push
    of enabled = false does; ``ops`` have no proxy port, so systemd is asked directly. Under the host's
    lock, recorded as an event; what was done, or None when the unit is absent or already off."""
    ports = ops.ports_for(host)
    sd = ports.systemd
    if not sd.unit_state(PROXY_UNIT).exists:
        return None  # the usual case, a host that never ran the proxy: no lock taken at the agent's start
    with host_lock(ops.state_dir, host, ops.holder(host)):
        state = sd.unit_state(PROXY_UNIT)
        if not state.exists:
            return None
        if state.is_active:
            sd.stop(PROXY_UNIT)
        elif state.is_failed:
            sd.reset_failed(PROXY_UNIT)
        unlinked = sd.disable(PROXY_UNIT)
    if not (state.is_active or unlinked):
        return None
    ops.record_event(ports.clock.now(), host, "proxy_stopped", {"reason": reason, "was_running": state.is_active})
    return f"{PROXY_UNIT} {'stopped and ' if state.is_active else ''}disabled: {reason}"


def _stop_verified(ctx: StepContext, model: str, unit: str, gpus: tuple[int, ...]) -> None:
    actions.stop_units(ctx, [unit])
    actions.free_gpus(ctx, gpus, [unit], sleepers=sleeper_mib(ctx, but=[model]))
    if ctx.ports.systemd.unit_state(unit).exists:
        ctx.ports.systemd.disable(unit)
    mark(ctx, model, STOPPED, unit=unit)


def _leave_set(ops: Operations, host: str, revision: int, rest: list[int]) -> None:
    current = ops.store.serving(host)
    ops.store.move_serving(
        ServingChange(
            pointers=((host, None),) if current is not None and current.revision == revision else (),
            sets=((host, tuple(rest)),),
        )
    )
