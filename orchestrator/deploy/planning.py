"""Planning a host's deployments (no step runs here): the unit a model renders to, which serving models
a switch replaces and whether it keeps the route up, a rollback's target, and whether what serves is
healthy (so a switch to it is a no-op). ``Planner`` is the deployer's planning half; deploy/deployer.py's
``Deployer`` adds the running half (the one module that moves a deployment).
"""

from __future__ import annotations

import getpass

from orchestrator import logs
from orchestrator.core.catalog import Catalog, Model
from orchestrator.core.multinode import render_nodes, unit_names
from orchestrator.core.records import Deployment, Mode, NodeUnit, UnitSpec
from orchestrator.core.render import engine_address, load_deadline, model_dir_for, render_unit
from orchestrator.core.states import Phase, fallback_of
from orchestrator.core.switch_plan import Serving, SwitchPlan, plan_switch
from orchestrator.deploy.adopt import alive
from orchestrator.deploy.beside import room_beside
from orchestrator.deploy.preflight import check_access
from orchestrator.deploy.step_inputs import PortsFactory, ready_restarts
from orchestrator.engines import ENGINE
from orchestrator.errors import NodeInUse, OrchestratorError, UsageError
from orchestrator.ports import ResidencyStore, StateStore
from orchestrator.resources import template_text

log = logs.get_logger()


def default_template() -> str:
    return template_text(ENGINE.template)


def template_for(model: Model, template: str) -> str:
    """The unit template ``model`` renders from: ``template`` (the default engine's, maybe the operator's
    own) for a model on the default engine, else its engine's shipped one."""
    return template if model.engine_name == ENGINE.name else template_text(model.engine.template)


def default_trigger() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def unit_spec(
    catalog: Catalog, model: Model, template: str, *, model_dir: str | None = None, revision: str | None = None
) -> UnitSpec:
    """The rendered unit(s) of ``model`` and what the engine needs to run them (no I/O);
    ``template`` is the text of the default engine's unit template (a model on another engine renders
    that engine's shipped one)."""
    host = catalog.model_host(model.name)
    template = template_for(model, template)
    directory = model_dir or model_dir_for(catalog, model, revision)
    nodes: tuple[NodeUnit, ...] = ()
    if model.nodes:

        def named(name: str) -> str:
            return template if name == model.engine.template else template_text(name)

        rendered = render_nodes(catalog, model, named, model_dir=directory, revision=revision)
        unit, nodes = rendered.api, rendered.nodes
    else:
        unit = render_unit(catalog, model, template, model_dir=directory)
    address = engine_address(catalog, model, host)
    return UnitSpec(
        model=model.name,
        unit_name=unit.name,
        unit_text=unit.text,
        unit_sha=unit.sha256,
        served_name=model.served,
        address=address,
        port=model.port,
        gpus=model.gpus,
        load_deadline_s=load_deadline(catalog, model),
        model_dir=directory,
        repo=model.repo,
        revision=revision or model.revision,
        source=model.source,
        nodes=nodes,
        backend=model.backend if model.nodes else "",
        engine=model.engine_name,
    )


class Planner:
    """Plans a host's deployments: each ``plan_*`` records a new one (phase planned) or says none is needed."""

    def __init__(
        self,
        catalog: Catalog,
        store: StateStore,
        ports_for: PortsFactory,
        *,
        template: str | None = None,
        residency: ResidencyStore | None = None,
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.residency = residency
        self.ports_for = ports_for
        self.template = template if template is not None else default_template()
        # (host, model, weights folder) whose access check passed before this planner recorded a deployment
        # of it: the deployment's preflight step does not probe the host again (deploy/steps.py).
        self.access_checked: set[tuple[str, str, str]] = set()

    def check_access(self, model_name: str) -> None:
        """Refuse (exit 2) a switch whose unit's user cannot run the engine or read the weights, before a
        deployment is recorded (not a rollback); the preflight of the one this planner records then skips it."""
        host = self.catalog.model_host(model_name).name
        model_dir = self.spec_for(self.catalog.model(model_name)).model_dir
        check_access(self.catalog, model_name, self.ports_for(host), model_dir)
        self.access_checked.add((host, model_name, model_dir))

    def spec_for(self, model: Model, model_dir: str | None = None, revision: str | None = None) -> UnitSpec:
        return unit_spec(self.catalog, model, self.template, model_dir=model_dir, revision=revision)

    def plan_switch(
        self, model_name: str, *, trigger: str | None = None, no_rollback: bool = False, force: bool = False
    ) -> Deployment | None:
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
        return self.store.create(
            host.name,
            spec,
            trigger or default_trigger(),
            previous,
            self.ports_for(host.name).clock.now(),
            no_rollback=no_rollback,
            fallback=fallback_of(previous_revision=previous, in_set=False, no_rollback=no_rollback),
        )

    def _plan_in_set(self, model: Model, *, trigger: str | None, no_rollback: bool, force: bool) -> Deployment | None:
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

    def plan_spec(
        self, host: str, spec: UnitSpec, trigger: str, *, no_rollback: bool = False, restores: int | None = None
    ) -> Deployment:
        """A deployment of ``spec`` into the host's serving set, with its plan recorded; ``restores``:
        the revision whose recorded unit ``spec`` is (a rollback)."""
        plan = self.explain(host, spec)
        holders = [r for r in plan.displaced if self.store.by_revision(host, r).spec.served_name == spec.served_name]
        previous = holders[0] if holders else (plan.displaced[0] if plan.displaced else None)
        no_rollback = no_rollback or not self.catalog.policy.rollback_on_failure  # as plan_switch: every switch
        dep = self.store.create(
            host,
            spec,
            trigger,
            previous,
            self.ports_for(host).clock.now(),
            no_rollback=no_rollback,
            restores=restores,
            fallback=fallback_of(previous_revision=previous, in_set=True, no_rollback=no_rollback),
            plan=plan.to_dict(),
        )
        return dep

    def plan_of(self, dep: Deployment) -> SwitchPlan | None:
        data = self.store.plan_of(dep.id)
        return None if data is None else SwitchPlan.from_dict(data)

    def plan_rollback(
        self, host_name: str, to_revision: int | None = None, *, trigger: str = "rollback", no_rollback: bool = False
    ) -> Deployment:
        """A new deployment that redeploys a recorded revision's exact unit."""
        if host_name not in self.catalog.hosts:
            raise UsageError(f"unknown host {host_name!r} (known: {', '.join(sorted(self.catalog.hosts))})")
        serving = self.store.serving(host_name)
        if to_revision is None:
            if serving is None or serving.previous_revision is None:
                raise UsageError(
                    f"host {host_name} has no previous stable revision to roll back to (see `orchestrator history`)"
                )
            to_revision = serving.previous_revision
        target = self.store.by_revision(host_name, to_revision)
        if not target.spec.nodes:
            self.refuse_foreign_ranks(host_name, target.spec.gpus, target.model)
        if target.phase is not Phase.ACTIVE:
            raise UsageError(
                f"host {host_name}: revision {to_revision} ({target.model}) never became "
                f"active (outcome {target.phase.value}); roll back to one that did"
            )
        previous = serving.revision if serving else None
        no_rollback = no_rollback or not self.catalog.policy.rollback_on_failure
        return self.store.create(
            host_name,
            target.spec,
            f"{trigger}:to-{to_revision}",
            previous,
            self.ports_for(host_name).clock.now(),
            no_rollback=no_rollback,
            restores=to_revision,
            fallback=fallback_of(previous_revision=previous, in_set=False, no_rollback=no_rollback),
        )

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
                raise NodeInUse(
                    f"{model} needs GPU {shared} on {host}, where {', '.join(running)} runs a rank of "
                    f"multi-node model {other.name} (headed on {hosts[0]}): nothing was stopped; stop "
                    f"that model on every node first with `orchestrator stop {other.name}`, or switch "
                    f"{hosts[0]} to another model",
                    host=host,
                )

    def is_healthy(self, dep: Deployment) -> bool:
        try:
            ports = self.ports_for(dep.host)  # builds the host's connection on first use: may fail too
            ready = ready_restarts(self.store, dep)
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
            control = ports.engine_control_for(dep.spec)
            return not (control is not None and control.is_sleeping(dep.spec.base_url))
        except OrchestratorError:
            return False
