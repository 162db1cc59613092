"""The deployer: plans deployments and drives them through the state machine, one step at a time.

Each phase change is written to the store before the next step runs. Running a deployment that
was interrupted (a crash, SIGTERM) re-runs the step it was in: steps are idempotent. Any failure
from ``stopping`` on brings the previous stable revision back, once; a failed rollback is final.
"""

from __future__ import annotations

import getpass
import threading
from collections.abc import Callable
from typing import Any

import structlog

from orchestrator import logs
from orchestrator.core.catalog import Catalog, Model
from orchestrator.core.multinode import render_nodes, unit_names
from orchestrator.core.proxy import Serving, SwitchPlan, plan_switch
from orchestrator.core.records import NO_CHANGE, Deployment, Mode, NodeUnit, ServingChange, UnitSpec
from orchestrator.core.render import engine_address, load_deadline, model_dir_for, render_unit
from orchestrator.core.states import (
    ABANDONABLE,
    Event,
    Phase,
    Serves,
    advance,
    failed,
    fallback_of,
    is_terminal,
    moves_serving,
    reported,
)
from orchestrator.deploy import actions
from orchestrator.deploy.adopt import alive
from orchestrator.deploy.beside import room_beside
from orchestrator.deploy.context import Parked, StepContext, StepInput
from orchestrator.deploy.multinode import NODE_PROGRESS
from orchestrator.deploy.steps import STEPS
from orchestrator.deploy.warm import sleep_enabled
from orchestrator.deploy.warm_steps import WARM_EVENT
from orchestrator.engines import ENGINE
from orchestrator.errors import NodeInUse, OrchestratorError, SmokeGateFailed, UsageError
from orchestrator.ports import HostPorts, ProgressCallback, ResidencyStore, StateStore
from orchestrator.resources import template_text
from orchestrator.secrets import redact, redact_tree

log = logs.get_logger()

PortsFactory = Callable[[str], HostPorts]
StepHook = Callable[[Deployment], None]


def default_template() -> str:
    return template_text(ENGINE.template)


def default_trigger() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def unit_spec(catalog: Catalog, model: Model, template: str, *, model_dir: str | None = None,
              revision: str | None = None) -> UnitSpec:
    """The rendered unit(s) of ``model`` and what the engine needs to run them (no I/O);
    ``template`` is the text of the engine's unit template."""
    host = catalog.model_host(model.name)
    directory = model_dir or model_dir_for(catalog, model, revision)
    nodes: tuple[NodeUnit, ...] = ()
    if model.nodes:
        def named(name: str) -> str:
            return template if name == ENGINE.template else template_text(name)

        rendered = render_nodes(catalog, model, named, model_dir=directory, revision=revision)
        unit, nodes = rendered.api, rendered.nodes
    else:
        unit = render_unit(catalog, model, template, model_dir=directory)
    address = engine_address(catalog, model, host)
    return UnitSpec(model=model.name, unit_name=unit.name, unit_text=unit.text, unit_sha=unit.sha256,
                    served_name=model.served, address=address, port=model.port, gpus=model.gpus,
                    load_deadline_s=load_deadline(catalog, model), model_dir=directory,
                    repo=model.repo, revision=revision or model.revision, source=model.source,
                    nodes=nodes, backend=model.backend if model.nodes else "")


def record_running(store: StateStore, host: str, spec: UnitSpec, trigger: str, now: float, *,
                   in_set: bool) -> Deployment:
    """Record what already runs (an adoption) as a revision: created planned, then moved by the table's
    ``adopted`` event to active, the host's serving revision (and, with the front proxy, ``in_set``: in
    its serving set beside what serves there)."""
    previous = store.serving(host)
    dep = store.create(host, spec, trigger, previous.revision if previous else None, now)
    sets = ((host, (*(d.revision for d in store.serving_set(host)), dep.revision)),) if in_set else ()
    store.transition(dep.id, advance(dep.phase, Event.ADOPTED), now,
                     ServingChange(pointers=((host, dep.revision),), sets=sets))
    return store.get(dep.id)


class Deployer:
    """Plans a host's deployments and drives each through core/states.py's table (``run``)."""

    def __init__(self, catalog: Catalog, store: StateStore, ports_for: PortsFactory, *,
                 template: str | None = None, progress: ProgressCallback | None = None,
                 before_step: StepHook | None = None, residency: ResidencyStore | None = None) -> None:
        self.catalog = catalog
        self.store = store
        self.residency = residency
        self.ports_for = ports_for
        self.template = template if template is not None else default_template()
        self.progress: ProgressCallback = progress or (lambda event, fields: None)
        self.before_step = before_step
        # Set by SIGTERM handling: finish the current step, persist, and leave the rest for resume.
        self.park = threading.Event()
        # Models on demand: asked while the target starts and is checked (StepContext.abandon).
        self.abandon: Callable[[], str | None] | None = None

    # -- planning -----------------------------------------------------------------------------
    def spec_for(self, model: Model, model_dir: str | None = None, revision: str | None = None) -> UnitSpec:
        return unit_spec(self.catalog, model, self.template, model_dir=model_dir, revision=revision)

    def plan_switch(self, model_name: str, *, trigger: str | None = None, no_rollback: bool = False,
                    force: bool = False) -> Deployment | None:
        """A new deployment of ``model_name``, or None when it already serves, healthy, unchanged."""
        model = self.catalog.model(model_name)
        host = self.catalog.model_host(model_name)
        if not model.nodes:
            self.refuse_foreign_ranks(host.name, model.gpus, model_name)
        if self.catalog.proxy.enabled:
            return self._plan_in_set(model, trigger=trigger, no_rollback=no_rollback, force=force)
        serving = self.store.serving(host.name)
        spec = self.spec_for(model)
        if serving is not None and serving.spec.model == model_name and not force:
            # Compare against what serves, in its staged directory: an unpinned branch is not
            # re-resolved here (no network for a no-op); --force does that.
            same = self.spec_for(model, model_dir=serving.spec.model_dir, revision=serving.spec.revision)
            # an adopted hand-run engine runs outside systemd: a switch to its own entry takes it under
            if same.unit_sha == serving.spec.unit_sha and serving.spec.pid is None and self.is_healthy(serving):
                return None
        previous = serving.revision if serving is not None else None
        # policy.rollback_on_failure = false is --no-rollback for every switch, the agent's included.
        no_rollback = no_rollback or not self.catalog.policy.rollback_on_failure
        return self.store.create(host.name, spec, trigger or default_trigger(), previous,
                                 self.ports_for(host.name).clock.now(), no_rollback=no_rollback,
                                 fallback=fallback_of(previous_revision=previous, in_set=False,
                                                      no_rollback=no_rollback))

    # -- with the front proxy: a host serves a set of models ------------------------------------
    def _plan_in_set(self, model: Model, *, trigger: str | None, no_rollback: bool,
                     force: bool) -> Deployment | None:
        host = self.catalog.model_host(model.name).name
        spec = self.spec_for(model)
        for serving in self.store.serving_set(host):
            if serving.spec.model == model.name and not force:
                same = self.spec_for(model, model_dir=serving.spec.model_dir, revision=serving.spec.revision)
                if same.unit_sha == serving.spec.unit_sha and serving.spec.pid is None and self.is_healthy(serving):
                    return None
        return self.plan_spec(host, spec, trigger or default_trigger(), no_rollback=no_rollback)

    def explain(self, host: str, spec: UnitSpec) -> SwitchPlan:
        """Which serving models a switch to ``spec`` replaces, and whether it keeps the route up: a
        stop-start whose target fits beside what serves (read from the GPUs now) becomes beside."""
        serving = [Serving(d.revision, d.spec) for d in self.store.serving_set(host)]
        plan = plan_switch(spec, serving)
        if plan.mode is not Mode.STOP_START or spec.nodes:
            return plan
        try:
            fit = room_beside(self.ports_for(host), self.catalog, self.residency, spec, (s.spec for s in serving))
        except OrchestratorError as exc:
            log.info("beside_unknown", host=host, model=spec.model, error=str(exc))
            return plan
        return plan_switch(spec, serving, fit)

    def plan_spec(self, host: str, spec: UnitSpec, trigger: str, *, no_rollback: bool = False,
                  restores: int | None = None) -> Deployment:
        """A deployment of ``spec`` into the host's serving set, with its plan recorded; ``restores``:
        the revision whose recorded unit ``spec`` is (a rollback)."""
        plan = self.explain(host, spec)
        holders = [r for r in plan.displaced
                   if self.store.by_revision(host, r).spec.served_name == spec.served_name]
        previous = holders[0] if holders else (plan.displaced[0] if plan.displaced else None)
        no_rollback = no_rollback or not self.catalog.policy.rollback_on_failure  # as plan_switch: every switch
        dep = self.store.create(host, spec, trigger, previous, self.ports_for(host).clock.now(),
                                no_rollback=no_rollback, restores=restores,
                                fallback=fallback_of(previous_revision=previous, in_set=True, no_rollback=no_rollback),
                                plan=plan.to_dict())
        return dep

    def plan_of(self, dep: Deployment) -> SwitchPlan | None:
        data = self.store.plan_of(dep.id)
        return None if data is None else SwitchPlan.from_dict(data)

    def plan_rollback(self, host_name: str, to_revision: int | None = None, *, trigger: str = "rollback",
                      no_rollback: bool = False) -> Deployment:
        """A new deployment that redeploys a recorded revision's exact unit."""
        if host_name not in self.catalog.hosts:
            raise UsageError(f"unknown host {host_name!r} (known: {', '.join(sorted(self.catalog.hosts))})")
        serving = self.store.serving(host_name)
        if to_revision is None:
            if serving is None or serving.previous_revision is None:
                raise UsageError(f"host {host_name} has no previous stable revision to roll back to"
                                 " (see `orchestrator history`)")
            to_revision = serving.previous_revision
        target = self.store.by_revision(host_name, to_revision)
        if not target.spec.nodes:
            self.refuse_foreign_ranks(host_name, target.spec.gpus, target.model)
        if target.phase is not Phase.ACTIVE:
            raise UsageError(f"host {host_name}: revision {to_revision} ({target.model}) never became "
                             f"active (outcome {target.phase.value}); roll back to one that did")
        previous = serving.revision if serving else None
        no_rollback = no_rollback or not self.catalog.policy.rollback_on_failure
        return self.store.create(host_name, target.spec, f"{trigger}:to-{to_revision}", previous,
                                 self.ports_for(host_name).clock.now(), no_rollback=no_rollback,
                                 restores=to_revision,
                                 fallback=fallback_of(previous_revision=previous, in_set=False,
                                                      no_rollback=no_rollback))

    def refuse_foreign_ranks(self, host: str, gpus: tuple[int, ...], model: str) -> None:
        """Refuse, before anything is recorded or stopped, a single-box model on GPUs of ``host``
        where a rank (or Ray worker) of a multi-node model headed on another host runs.

        Refused rather than stopped: the multi-node model is the head's deployment (its record, its
        rollback, its watch live there); a switch aimed at one of its nodes taking the model down
        on every box would be a surprise no operator asked for, and an agent on this node may not
        even know the head's records. Stopping it is one explicit command, named in the message."""
        wanted = set(gpus)
        for other in self.catalog.models.values():
            hosts = [h.name for h in self.catalog.nodes_of(other.name)]
            if not other.nodes or host not in hosts[1:] or not wanted & set(other.gpus):
                continue
            sd = self.ports_for(host).systemd
            running = sorted(u for u in unit_names(self.catalog, other).get(host, set()) if sd.unit_state(u).is_active)
            if running:
                shared = ",".join(map(str, sorted(wanted & set(other.gpus))))
                raise NodeInUse(f"{model} needs GPU {shared} on {host}, where {', '.join(running)} runs a rank of "
                                f"multi-node model {other.name} (headed on {hosts[0]}): nothing was stopped; stop "
                                f"that model on every node first with `orchestrator stop {other.name}`, or switch "
                                f"{hosts[0]} to another model", host=host)

    def is_healthy(self, dep: Deployment) -> bool:
        try:
            ports = self.ports_for(dep.host)  # builds the host's connection on first use: may fail too
            ready = self._ready_restarts(dep)
            units = [(dep.host, dep.spec.unit_name), *((n.host, n.unit_name) for n in dep.spec.nodes)]
            if dep.spec.pid is not None and not alive(ports.shell, dep.spec):
                return False  # an adopted hand-run process: no unit, its own PID tells
            for host, unit in units if dep.spec.pid is None else []:
                # A multi-node model is down when any of its units is (or cannot be reached), and when
                # systemd restarted one on its own since it was ready: the rank that came back is a
                # new process the others never joined (rank 0's API may well still answer).
                state = self.ports_for(host).systemd.unit_state(unit)
                if not state.is_active or state.n_restarts > ready.get((host, unit), state.n_restarts):
                    return False
            ok, _ = ports.health.health(dep.spec.base_url)
            if not ok or dep.spec.served_name not in ports.health.models(dep.spec.base_url):
                return False
            # /health is 200 and the model listed while asleep: only /is_sleeping tells.
            return not (sleep_enabled(dep.spec) and ports.engine_control is not None
                        and ports.engine_control.is_sleeping(dep.spec.base_url))
        except OrchestratorError:
            return False

    # -- running ------------------------------------------------------------------------------
    def run(self, dep_id: int) -> Deployment:
        """Drive a deployment until it ends (or parks on SIGTERM); returns its final record."""
        dep = self.store.get(dep_id)
        ports = self.ports_for(dep.host)
        bound = {"deployment_id": dep.id, "host": dep.host, "revision": dep.revision}
        blog = log.bind(**bound)
        ctx = StepContext(ports=ports, catalog=self.catalog, progress=self.progress,
                          managed_units=self._managed_units(dep.host), bound=bound, park=self.park,
                          residency=self.residency)
        node_ctxs: dict[str, StepContext] = {}

        def node_ctx(host: str) -> StepContext:
            if host not in node_ctxs:
                node_ctxs[host] = StepContext(ports=self.ports_for(host), catalog=self.catalog,
                                              progress=self.progress, managed_units=self._managed_units(host),
                                              bound={**bound, "node": host}, park=self.park)
            return node_ctxs[host]

        ctx.node_ctx = node_ctx
        ctx.record = lambda kind, detail: self.store.record_event(
            ports.clock.now(), dep.host, kind, redact_tree({"deployment_id": dep.id, "revision": dep.revision,
                                                            "phase": dep.phase.value, **detail}))
        while not is_terminal(dep.phase):
            if self.before_step is not None:
                self.before_step(dep)  # test hook: pause or park at a named phase
            if self.park.is_set():
                return self._parked(ctx, dep, blog)
            ctx.abandon = self.abandon if dep.phase in ABANDONABLE else None
            try:
                event = self._run_step(ctx, dep, blog)
            except Parked:
                return self._parked(ctx, dep, blog)
            nxt = advance(dep.phase, event, dep.fallback)
            # the outcome and what it changes about what serves: one transaction (no crash between)
            self.store.transition(dep.id, nxt, ports.clock.now(), self._serving_change(dep, nxt))
            if nxt is Phase.ACTIVE:
                self._clean_weights(ctx, dep)
            if nxt is Phase.ABORTED:
                self._routes_as_before(ctx, dep, blog)
            blog.info("phase_changed", phase=nxt.value, previous=dep.phase.value, on=event.value)
            plan = self.plan_of(dep)
            # what the phase does in this switch, so that progress lines say only what happens
            ctx.emit("phase", phase=nxt.value, model=dep.model, proxy=plan is not None,
                     handover=plan is not None and plan.keeps_serving,
                     beside=plan is not None and plan.mode is Mode.BESIDE)
            dep = self.store.get(dep.id)
        return dep

    def _routes_as_before(self, ctx: StepContext, dep: Deployment, blog: structlog.typing.FilteringBoundLogger) -> None:
        """A switch that ended before stopping anything: the proxy routes the set as it was, without the
        "loading" answer staging gave the target's name (nothing loads it now)."""
        plan = self.plan_of(dep)
        if plan is None:
            return
        try:
            actions.route(ctx, (self.store.by_revision(dep.host, r).spec for r in plan.before))
        except OrchestratorError as exc:  # the switch's own error is the one to report; this one is logged
            blog.warning("routes_not_restored", error=str(exc))

    def _parked(self, ctx: StepContext, dep: Deployment, blog: structlog.typing.FilteringBoundLogger) -> Deployment:
        blog.info("deployment_parked", phase=dep.phase.value)
        ctx.emit("parked", phase=dep.phase.value)
        return dep

    def _run_step(self, ctx: StepContext, dep: Deployment, blog: structlog.typing.FilteringBoundLogger) -> Event:
        """Run the phase's step and persist what it returns; map a failure to the table's event."""
        plan = self.plan_of(dep)
        serving = () if plan is None else tuple(self.store.by_revision(dep.host, r) for r in plan.before)
        step = StepInput(dep=dep, previous=self._previous(dep), units_to_stop=self._units_to_stop(dep, plan),
                         respec=lambda path, revision: self.spec_for(self.catalog.models[dep.model],
                                                                     model_dir=path, revision=revision),
                         plan=plan, serving=serving, node_units_to_stop=self._node_units_to_stop(dep),
                         peer_restore=self._peer_restore(dep), node_progress=self.node_progress(dep),
                         warm_progress=self.warm_progress(dep))
        try:
            result = STEPS[dep.phase](ctx, step)
        except OrchestratorError as exc:
            if isinstance(exc, SmokeGateFailed):
                self.store.record_bench(dep.id, exc.bench)
            if dep.phase is Phase.ROLLING_BACK:
                blog.error("rollback_failed", error=str(exc))
                self.store.record_error(dep.id, rollback_error=redact(str(exc)))
                return Event.FAIL
            blog.error("step_failed", phase=dep.phase.value, error=str(exc))
            self.store.record_error(dep.id, error=redact(f"{dep.phase.value}: {exc}"))
            # which event it reports, and where that leads (rollback, a cold restart, or not), are the table's
            return failed(dep.phase, exc)
        if result.spec is not None:
            self.store.update_spec(dep.id, result.spec)
        if result.bench is not None:
            self.store.record_bench(dep.id, result.bench)
        return reported(dep.phase, result.event)

    def warm_progress(self, dep: Deployment) -> tuple[dict[str, Any], ...]:
        """What the warm steps of ``dep`` did so far, oldest first (persisted as they ran)."""
        found = self.store.events(host=dep.host, kind=WARM_EVENT, limit=200)
        return tuple(reversed([e for e in found if e.get("deployment_id") == dep.id]))

    # -- helpers ------------------------------------------------------------------------------
    def _ready_restarts(self, dep: Deployment) -> dict[tuple[str, str], int]:
        """Each unit of a multi-node model: systemd's restart count when a deployment last found it
        ready (the newest record of that very unit text wins: a rollback's restore counts too)."""
        if not dep.spec.nodes:
            return {}
        shas = {(n.host, n.unit_name): n.unit_sha for n in dep.spec.nodes} | {
            (dep.host, dep.spec.unit_name): dep.spec.unit_sha}
        out: dict[tuple[str, str], int] = {}
        for e in self.store.events(host=dep.host, kind=NODE_PROGRESS, limit=500):
            key = (str(e.get("node")), str(e.get("unit")))
            if e.get("step") == "ready" and key not in out and shas.get(key) == e.get("sha256"):
                out[key] = int(e.get("n_restarts") or 0)
        return out

    def node_progress(self, dep: Deployment) -> tuple[dict[str, Any], ...]:
        """What the deployment did on each node of a multi-node model, oldest first, as persisted
        while its steps ran (deploy/multinode.py): it survives a crash in the middle of a step."""
        if not dep.spec.nodes:
            return ()
        found = self.store.events(host=dep.host, kind=NODE_PROGRESS, limit=500)
        return tuple(reversed([e for e in found if e.get("deployment_id") == dep.id]))

    def _managed_units(self, host: str) -> frozenset[str]:
        units = {self.catalog.models[m].unit_name for m in self.catalog.models_on(host)}
        units |= {d.spec.unit_name for d in self.store.history(host, limit=20)}
        return frozenset(units)

    def _previous(self, dep: Deployment) -> Deployment | None:
        if dep.previous_revision is None:
            return None
        return self.store.by_revision(dep.host, dep.previous_revision)

    def _units_to_stop(self, dep: Deployment, plan: SwitchPlan | None = None) -> frozenset[str]:
        """The recorded serving unit, the target itself (redeploy), and any managed unit on our GPUs.

        With the proxy, only the serving models on our GPUs: a handover's (or beside) old engine
        stops later, once the route moved."""
        units = {dep.spec.unit_name}
        if plan is not None:
            units |= {self.store.by_revision(dep.host, r).spec.unit_name for r in plan.overlapping}
            kept = {self.store.by_revision(dep.host, r).spec.unit_name for r in plan.before
                    if r not in plan.displaced or plan.mode is Mode.BESIDE}
            wanted = set(dep.spec.gpus)
            units |= {self.catalog.models[n].unit_name for n in self.catalog.models_on(dep.host)
                      if wanted & set(self.catalog.models[n].gpus)}
            return frozenset(units - kept)
        if dep.previous_revision is not None:
            units.add(self.store.by_revision(dep.host, dep.previous_revision).spec.unit_name)
        wanted = set(dep.spec.gpus)
        for name in self.catalog.models_on(dep.host):
            if wanted & set(self.catalog.models[name].gpus):
                units.add(self.catalog.models[name].unit_name)
        return frozenset(units)

    def _node_units_to_stop(self, dep: Deployment) -> dict[str, frozenset[str]]:
        """Multi-node: units beyond the head's usual ones, by host, in stop order (other nodes in
        reverse, the head's extra units last): the target's and the previous revision's node units,
        what serves on the target's other nodes, and any catalog unit there on the target's GPUs."""
        prev = self._previous(dep)
        specs = [dep.spec] + ([prev.spec] if prev is not None else [])
        hosts = [dep.host, *dep.spec.node_hosts]
        out: dict[str, set[str]] = {}
        for spec in specs:
            for node in reversed(spec.nodes):
                out.setdefault(node.host, set()).add(node.unit_name)
        for peer in hosts[1:]:
            serving = self.store.serving(peer) if peer != dep.host else None
            if serving is not None:
                out.setdefault(peer, set()).add(serving.spec.unit_name)
        wanted = set(dep.spec.gpus)
        for model in self.catalog.models.values():
            if dep.spec.nodes and wanted & set(model.gpus):
                for host, units in unit_names(self.catalog, model).items():
                    if host in hosts[1:] or (host == dep.host and model.name != dep.model):
                        out.setdefault(host, set()).update(units)
        order = sorted(out, key=lambda h: (h == dep.host, -hosts.index(h) if h in hosts else 0))
        return {h: frozenset(out[h]) for h in order}

    def _peer_restore(self, dep: Deployment) -> dict[str, UnitSpec]:
        """What serves now on the target's other nodes (single-box models), to bring back on rollback."""
        out = {}
        for peer in dep.spec.node_hosts:
            serving = self.store.serving(peer) if peer != dep.host else None
            if serving is not None and not serving.spec.nodes:
                out[peer] = serving.spec
        return out

    def _clean_weights(self, ctx: StepContext, dep: Deployment) -> None:
        """Old staged revisions go by policy once the new one serves; never the serving or the
        previous stable one. A failure here is logged: the switch itself has succeeded."""
        store = ctx.ports.weights
        if store is None:
            return
        keep = [self.store.get(dep.id).spec] + [p.spec for p in [self._previous(dep)] if p is not None]
        try:
            removed = store.cleanup(keep)
        except OrchestratorError as exc:
            log.warning("weights_cleanup_failed", deployment_id=dep.id, host=dep.host, error=str(exc))
            return
        if removed:
            ctx.emit("weights_removed", revisions=[f"{r.name}@{r.revision}" for r in removed])

    def _serving_change(self, dep: Deployment, phase: Phase) -> ServingChange:
        """The serving pointers (and set) that entering ``phase`` moves (states.MOVES_SERVING says which
        outcomes move them, and to what)."""
        serves = moves_serving(phase)
        if serves is None:
            return NO_CHANGE
        target = serves is Serves.TARGET
        sets: tuple[tuple[str, tuple[int, ...]], ...] = ()
        plan = self.plan_of(dep)
        if plan is not None:
            kept = tuple(r for r in plan.before if r not in plan.displaced)
            sets = ((dep.host, (*kept, dep.revision) if target else kept),)
        # The other nodes now serve (part of) this model, not what they served alone before.
        pointers: list[tuple[str, int | None]] = [(peer, None) for peer in self._peer_restore(dep)]
        pointers.append((dep.host, dep.revision if target else None))
        return ServingChange(pointers=tuple(pointers), sets=sets)
