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
from orchestrator.deploy import actions, serving_set, warm
from orchestrator.deploy.locks import host_lock
from orchestrator.deploy.operations import Operations
from orchestrator.deploy.sleep_stop import sleep_or_stop
from orchestrator.errors import UsageError
from orchestrator.ports import ProgressCallback


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
        ctx = ops.context(host, progress, revision=dep.revision)
        rest = [d for d in serving if d.revision != dep.revision]
        actions.route(ctx, [d.spec for d in rest])
        actions.drain(ctx, [dep.spec])
        serving_set.leave(ops.store, host, dep.revision, in_set=True)
        # The job records one event of its own (below), not a deployment's warm notes.
        left = sleep_or_stop(ctx, dep.spec, sleep=True, free=True, disable=True, notes=False)
        outcome = "asleep" if left.asleep else "stopped"
        detail: dict[str, Any] = (
            {"seconds": round(left.seconds, 3)}
            if left.asleep
            else {"sleep_failed": left.sleep_failed or f"host {host} has no engine control port"}
        )
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
        ctx = ops.context(host)
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
        ctx = ops.context(host)
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
