"""The idempotent actions the steps are made of: observe the host first, act only on the difference.

Each gets a StepContext (the host's ports, the tunables, progress) and either returns or raises an
OrchestratorError. Actions never touch the state store; the engine does.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping

from orchestrator import logs
from orchestrator.core.health import Readiness, engine_errors, judge_models, judge_unit
from orchestrator.core.proxy import HostRouting, Route, host_routing, routes_for
from orchestrator.core.quiet import QUIET_POLL_S, Quiet, in_flight, verdict
from orchestrator.core.records import UnitSpec
from orchestrator.deploy.context import StepContext
from orchestrator.engines import engine_named
from orchestrator.errors import (
    GpuBusy,
    HealthCheckFailed,
    OrchestratorError,
    ProxyError,
    SystemdError,
    UnitNotFound,
)
from orchestrator.ports import FrontProxy
from orchestrator.secrets import redact

log = logs.get_logger()


def journal_hint(ctx: StepContext, unit: str, lines: int = 15, scan: int = 300) -> str:
    try:
        journal = [redact(line) for line in ctx.ports.systemd.journal_tail(unit, max(lines, scan))]
    except OrchestratorError as exc:
        return f"\n(journal of {unit} unavailable: {exc})"
    # The engine's reason often sits above its shutdown lines: name it before the tail.
    errors = engine_errors(journal[:-lines] if len(journal) > lines else [])
    # An engine's last line can be a 10 KB exception (one that lists every architecture it knows).
    tail = [line if len(line) <= 400 else line[:400] + " [...]" for line in journal[-lines:]]
    head = "".join(f"\nengine error in the journal of {unit}: {error}" for error in errors)
    return head + (("\nlast lines of the journal of " + unit + ":\n  " + "\n  ".join(tail)) if tail else "")


def stop_units(ctx: StepContext, units: Iterable[str]) -> list[str]:
    """Stop every given unit that is running; returns the ones that were."""
    stopped = []
    for unit in sorted(set(units)):
        state = ctx.ports.systemd.unit_state(unit)
        if state.is_active or state.active_state == "deactivating":
            ctx.emit("stop", unit=unit)
            ctx.ports.systemd.stop(unit, timeout=ctx.defaults.stop_timeout_s + 30)
            stopped.append(unit)
        if state.is_failed:
            ctx.ports.systemd.reset_failed(unit)
    return stopped


def free_gpus(
    ctx: StepContext, gpus: tuple[int, ...], units: Iterable[str], sleepers: Mapping[int, int] | None = None
) -> None:
    """Return when ``gpus`` hold no process and no memory; reap what the stopped units left behind.
    ``sleepers``: PIDs of sleeping engines that may stay, each with at most that many MiB per GPU.

    Leftovers in a managed unit's cgroup get SIGTERM, then SIGKILL after half the grace period.
    Anything else on those GPUs is not ours to kill: after the timeout it stops the switch with
    its PID, name and memory in the error.
    """
    sd, clock = ctx.ports.systemd, ctx.ports.clock
    wanted = frozenset(gpus)
    start = clock.monotonic()
    timeout = ctx.defaults.free_timeout_s
    termed: set[str] = set()
    killed: set[str] = set()
    # Each cgroup read is a round trip on a remote host: after the first look, only units that
    # still had processes are looked at again (a stopped unit gains no new ones).
    suspects = sorted(set(units))
    while True:
        leftovers = {u: sd.cgroup_pids(u) for u in suspects}
        leftovers = {u: p for u, p in leftovers.items() if p}
        suspects = sorted(leftovers)
        snap = ctx.ports.gpus.snapshot()
        known = {g.index for g in snap.gpus}
        missing = sorted(wanted - known)
        if missing:
            raise GpuBusy(
                f"GPU {','.join(map(str, missing))} does not exist: nvidia-smi shows GPUs "
                f"{','.join(map(str, sorted(known))) or 'none'}",
                host=ctx.ports.host.name,
            )
        allowed = sleepers or {}
        kept = [p for p in snap.on(wanted) if p.pid in allowed and p.used_memory_mib <= allowed[p.pid]]
        procs = tuple(p for p in snap.on(wanted) if p not in kept)
        used = {
            g.index: g.memory_used_mib - sum(p.used_memory_mib for p in kept if p.gpu_index == g.index)
            for g in snap.gpus
            if g.index in wanted
        }
        busy_mem = {i: m for i, m in used.items() if m > ctx.free_threshold_mib}
        if not leftovers and not procs and not busy_mem:
            ctx.emit("gpus_free", gpus=list(gpus), seconds=round(clock.monotonic() - start, 3))
            return
        elapsed = clock.monotonic() - start
        for unit, pids in leftovers.items():
            if unit not in termed:
                log.warning("orphans_found", unit=unit, pids=pids)
                ctx.emit("reap", unit=unit, pids=pids, signal="SIGTERM")
                _signal(ctx, unit, pids, signal.SIGTERM)
                termed.add(unit)
            elif unit not in killed and elapsed > timeout / 2:
                ctx.emit("reap", unit=unit, pids=pids, signal="SIGKILL")
                _signal(ctx, unit, pids, signal.SIGKILL)
                killed.add(unit)
        if elapsed > timeout:
            ours = {pid for pids in leftovers.values() for pid in pids}
            holders = [p for p in procs if p.pid not in ours] or list(procs)
            detail = ", ".join(
                f"pid {p.pid} {p.process_name} holds {p.used_memory_mib / 1024:.1f} GiB on GPU {p.gpu_index}"
                for p in holders
            )
            if not detail:
                detail = ", ".join(f"GPU {i} still uses {m / 1024:.1f} GiB" for i, m in busy_mem.items())
            if leftovers and not holders:
                detail = ", ".join(f"{u} still has pids {p}" for u, p in leftovers.items())
            raise GpuBusy(
                f"GPU {','.join(map(str, gpus))} not free {timeout:g} s after "
                f"{', '.join(sorted(set(units))) or 'the stop'}: {detail}",
                host=ctx.ports.host.name,
            )
        ctx.pause(min(0.2, ctx.defaults.health_interval_s))


def _signal(ctx: StepContext, unit: str, pids: list[int], sig: signal.Signals) -> None:
    """Signal a unit's leftovers through systemd; if systemd no longer knows the unit (its file is
    gone but the processes live on in its cgroup), signal those PIDs, which are provably its own."""
    try:
        ctx.ports.systemd.kill_unit(unit, sig)
    except UnitNotFound:
        ctx.ports.shell.run(["kill", "-s", sig.name.removeprefix("SIG"), *map(str, pids)], check=False)


def install_unit(ctx: StepContext, spec: UnitSpec) -> bool:
    """Write the unit if its text differs and reload; returns whether anything changed."""
    sd = ctx.ports.systemd
    changed = sd.read_unit(spec.unit_name) != spec.unit_text
    if changed:
        sd.install_unit(spec.unit_name, spec.unit_text)
        sd.daemon_reload()
    state = sd.unit_state(spec.unit_name)
    if state.load_state != "loaded":
        raise SystemdError(
            f"{spec.unit_name} did not load after daemon-reload (load state "
            f"{state.load_state}): the unit file is invalid" + journal_hint(ctx, spec.unit_name),
            host=ctx.ports.host.name,
            unit=spec.unit_name,
        )
    ctx.emit("installed", unit=spec.unit_name, changed=changed, sha256=spec.unit_sha[:12])
    return changed


def start_unit(ctx: StepContext, spec: UnitSpec) -> None:
    sd = ctx.ports.systemd
    state = sd.unit_state(spec.unit_name)
    if state.is_active:
        return
    if state.is_failed:
        sd.reset_failed(spec.unit_name)
    try:
        sd.start(spec.unit_name)
    except SystemdError as exc:
        raise SystemdError(
            f"{exc}{journal_hint(ctx, spec.unit_name)}", host=ctx.ports.host.name, unit=spec.unit_name
        ) from exc


def wait_ready(ctx: StepContext, spec: UnitSpec) -> float:
    """Poll until the server proves it serves; returns the seconds it took.

    Fails at once when systemd reports the unit failed or restarting, with the journal's tail.
    """
    sd, probe, clock = ctx.ports.systemd, ctx.ports.health, ctx.ports.clock
    engine = engine_named(spec.engine)
    start = clock.monotonic()
    restarts_before = sd.unit_state(spec.unit_name).n_restarts
    next_note = start
    next_unit_check = start
    completion_errors = 0
    completion_error = ""
    last = "not probed yet"
    while True:
        elapsed = clock.monotonic() - start
        if clock.monotonic() >= next_unit_check:
            # systemd's view costs a round trip on remote hosts; once a second catches a crash loop.
            unit_verdict = judge_unit(sd.unit_state(spec.unit_name), restarts_before)
            if unit_verdict is not None:
                after = f" after {completion_error}" if completion_error else ""  # died answering it
                raise HealthCheckFailed(
                    unit_verdict.detail + after + journal_hint(ctx, spec.unit_name),
                    host=ctx.ports.host.name,
                    unit=spec.unit_name,
                )
            next_unit_check = clock.monotonic() + 1.0
        ok, last = probe.health(spec.base_url)
        if ok and _asleep(ctx, spec):
            asleep = f"GET {spec.base_url}{engine.sleep_api.is_sleeping}: true"
            ok, last = False, f"{asleep} ({engine.health_path} answers 200 while asleep)"
        if ok:
            verdict = judge_models(probe.models(spec.base_url), spec.served_name, engine)
            last = verdict.detail
            if verdict.readiness is Readiness.READY:
                try:
                    probe.complete(spec.base_url, spec.served_name)
                    ctx.emit("ready", unit=spec.unit_name, seconds=round(elapsed, 3))
                    return elapsed
                except HealthCheckFailed as exc:
                    completion_errors += 1
                    last = completion_error = str(exc)
                    if completion_errors >= ctx.completion_attempts:
                        raise HealthCheckFailed(
                            f"{spec.unit_name}: /health is 200 and /v1/models lists {spec.served_name}, "
                            f"but {completion_errors} completions failed: {exc}" + journal_hint(ctx, spec.unit_name),
                            host=ctx.ports.host.name,
                            unit=spec.unit_name,
                        ) from exc
        if elapsed > spec.load_deadline_s:
            raise HealthCheckFailed(
                f"{spec.unit_name} not ready after its load deadline of "
                f"{spec.load_deadline_s:g} s; last probe: {last}" + journal_hint(ctx, spec.unit_name),
                host=ctx.ports.host.name,
                unit=spec.unit_name,
            )
        if clock.monotonic() >= next_note:
            ctx.emit(
                "waiting", unit=spec.unit_name, seconds=round(elapsed, 1), deadline=spec.load_deadline_s, last=last
            )
            next_note = clock.monotonic() + 5.0
        ctx.pause(ctx.defaults.health_interval_s)


def _asleep(ctx: StepContext, spec: UnitSpec) -> bool:
    """The engine says it sleeps (only an engine that runs the unit with sleep mode is asked)."""
    control = ctx.ports.engine_control_for(spec)
    if control is None:
        return False
    try:
        return control.is_sleeping(spec.base_url)
    except OrchestratorError:
        return False  # not answering: the completion will tell


def settle_enablement(ctx: StepContext, serving: str, others: Iterable[str]) -> None:
    """After a model proves healthy: it comes back on reboot, the others do not."""
    sd = ctx.ports.systemd
    changed = False
    for unit in sorted(set(others) - {serving}):
        if sd.unit_state(unit).exists:
            changed |= sd.disable(unit, reload=False)
    changed |= sd.enable(serving, reload=False)
    if changed:
        sd.daemon_reload()  # one re-read of every unit file for all the links that changed


def route(ctx: StepContext, specs: Iterable[UnitSpec], gaps: Iterable[str] = (), loading: Iterable[str] = ()) -> bool:
    """Make the front proxy route exactly ``specs`` (``gaps`` answer 503 + Retry-After, "being
    switched"; ``loading`` names that neither serve nor are gaps the same, "loading")."""
    proxy = ctx.ports.proxy
    if proxy is None:
        return False
    routes = routes_for(list(specs), gaps, loading)
    changed = proxy.apply(_routing(ctx, routes))
    ctx.emit("routed", routes={r.name: r.target for r in routes}, changed=changed)
    return changed


def move_route(ctx: StepContext, specs: Iterable[UnitSpec]) -> bool:
    """``route(ctx, specs)`` where the running proxy can do it through its runtime API alone (only
    server states change: FrontProxy.move), else nothing; whether it did."""
    proxy = ctx.ports.proxy
    if proxy is None:
        return False
    routes = routes_for(list(specs), (), ())
    if not proxy.move(_routing(ctx, routes)):
        return False
    ctx.emit("routed", routes={r.name: r.target for r in routes}, changed=True, runtime=True)
    return True


def prepare_route(ctx: StepContext, specs: Iterable[UnitSpec]) -> None:
    """What ``route(ctx, specs)`` does before its reload, done ahead (FrontProxy.prepare): the route
    move that follows is the reload alone."""
    if ctx.ports.proxy is not None:
        ctx.ports.proxy.prepare(_routing(ctx, routes_for(list(specs), (), ())))


def _routing(ctx: StepContext, routes: list[Route]) -> HostRouting:
    host = ctx.ports.host
    bind = ctx.catalog.proxy.bind or host.bind or ctx.defaults.bind
    return host_routing(ctx.catalog, host.name, bind, routes)


def _addresses(specs: Iterable[UnitSpec]) -> list[tuple[str, int]]:
    """The engines' addresses as the proxy's servers name them, each once."""
    return sorted({(s.address, s.port) for s in specs})


def withdraw(ctx: StepContext, specs: Iterable[UnitSpec]) -> bool:
    """Take the routes to these engines out of the running proxy at once, without a reload (models on
    demand: a held request's wait has no reload in it); False when the proxy could not (then ``route``).
    The config on disk still lists them: the next ``route`` reloads whatever it renders."""
    proxy = ctx.ports.proxy
    targets = _addresses(specs)
    if proxy is None or not targets or not proxy.withdraw(targets):
        return False
    ctx.emit("withdrawn", engines=[f"{a}:{p}" for a, p in targets])
    return True


DRAIN_POLL_S = 0.02  # a warm switch's clients wait for the drain: notice its end soon


def drain(ctx: StepContext, engines: Iterable[UnitSpec]) -> None:
    """Bounded wait until no proxy worker can still send a request to these engines: no worker of an
    earlier config can (in-flight ones finished, no client connection left that could bring another
    one), then the running worker has none in flight there (after ``withdraw`` or a route moved through
    the runtime API there is no new config: the running worker's requests there finish here; after a
    reload it has none). Call it after ``route`` returned: the new config serves then, so the old
    workers are known. Past the deadline HAProxy's hard-stop-after (the same drain_timeout_s) ended them
    anyway."""
    proxy, clock = ctx.ports.proxy, ctx.ports.clock
    targets = _addresses(engines)
    if proxy is None or not targets:
        return
    deadline = clock.monotonic() + ctx.catalog.proxy.drain_timeout_s + 2.0
    start = clock.monotonic()
    while (left := _in_flight(proxy, targets)) != 0 and clock.monotonic() < deadline:
        ctx.pause(DRAIN_POLL_S)
    ctx.emit(
        "drained",
        seconds=round(clock.monotonic() - start, 3),
        still_draining=left,
        engines=[f"{a}:{p}" for a, p in targets],
    )


def _in_flight(proxy: FrontProxy, targets: list[tuple[str, int]]) -> int | None:
    """The old workers that can still reach ``targets``; once they are 0, the requests every worker
    has in flight there (None: the proxy could not tell). A proxy whose master gives no count at all
    (stopped, gone: ``sessions`` already asked again for a while) has nothing in flight to wait for:
    the old workers' 0 stands, as it did before the running worker was counted."""
    left = proxy.draining(targets)
    if left != 0:
        return left
    try:
        return in_flight(proxy.sessions(targets), targets)
    except OrchestratorError:
        return 0


def await_quiet(ctx: StepContext, engines: Iterable[UnitSpec]) -> tuple[Quiet, float]:
    """Before a warm switch moves the route off ``engines`` (they still serve meanwhile): wait, at most
    ``[proxy] quiet_wait_s``, until the proxy counts no request in flight to them (core/quiet.py says
    why none, not "none old"), reading every QUIET_POLL_S. Returns the last verdict and the seconds
    waited; no proxy, no engine or a bound of 0: at once. Only reads: a run stopped here changed nothing."""
    proxy, clock = ctx.ports.proxy, ctx.ports.clock
    targets = _addresses(engines)
    bound = ctx.catalog.proxy.quiet_wait_s
    if proxy is None or not targets or bound <= 0:
        return Quiet(True, "off", 0), 0.0
    start = clock.monotonic()
    while True:
        try:
            counts = proxy.sessions(targets)
        except ProxyError:
            counts = None  # no master answered: nothing to wait on
        quiet = verdict(counts, targets, clock.monotonic() - start, bound)
        waited = clock.monotonic() - start
        if quiet.move:
            return quiet, waited
        ctx.pause(min(QUIET_POLL_S, bound - waited))  # the reading at the bound moves it, not one after
