"""The engine: plans deployments and drives them through the state machine, one step at a time.

Each phase change is written to the store before the next step runs. Running a deployment that
was interrupted (a crash, SIGTERM) re-runs the step it was in: steps are idempotent. Any failure
from ``stopping`` on brings the previous stable revision back, once; a failed rollback is final.
"""

from __future__ import annotations

import getpass
import threading
from collections.abc import Callable

import structlog

from orchestrator.core.catalog import Catalog, Model
from orchestrator.core.records import Deployment, UnitSpec
from orchestrator.core.render import load_deadline, model_dir_for, render_unit
from orchestrator.core.states import Event, Phase, advance, is_terminal
from orchestrator.deploy import steps
from orchestrator.deploy.preflight import check_layout
from orchestrator.deploy.steps import HostPorts, StepContext
from orchestrator.errors import HealthCheckFailed, OrchestratorError, PlanError, SystemdError, UsageError
from orchestrator.ports import ProgressCallback, StateStore
from orchestrator.resources import template_text

log = structlog.get_logger()

PortsFactory = Callable[[str], HostPorts]
StepHook = Callable[[Deployment], None]


def default_template() -> str:
    return template_text("vllm.service.j2")


def default_trigger() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


class Engine:
    def __init__(self, catalog: Catalog, store: StateStore, ports_for: PortsFactory, *,
                 template: str | None = None, progress: ProgressCallback | None = None,
                 before_step: StepHook | None = None) -> None:
        self.catalog = catalog
        self.store = store
        self.ports_for = ports_for
        self.template = template if template is not None else default_template()
        self.progress: ProgressCallback = progress or (lambda event, fields: None)
        self.before_step = before_step
        # Set by SIGTERM handling: finish the current step, persist, and leave the rest for resume.
        self.park = threading.Event()

    # -- planning -----------------------------------------------------------------------------
    def spec_for(self, model: Model, model_dir: str | None = None, revision: str | None = None) -> UnitSpec:
        host = self.catalog.model_host(model.name)
        directory = model_dir or model_dir_for(self.catalog, model, revision)
        unit = render_unit(self.catalog, model, self.template, model_dir=directory)
        address = "127.0.0.1" if host.transport == "local" and host.address in ("", "localhost") else host.address
        return UnitSpec(model=model.name, unit_name=unit.name, unit_text=unit.text, unit_sha=unit.sha256,
                        served_name=model.served, address=address, port=model.port, gpus=model.gpus,
                        load_deadline_s=load_deadline(self.catalog, model), model_dir=directory,
                        repo=model.repo, revision=revision or model.revision, source=model.source)

    def plan_switch(self, model_name: str, *, trigger: str | None = None, no_rollback: bool = False,
                    force: bool = False) -> Deployment | None:
        """A new deployment of ``model_name``, or None when it already serves, healthy, unchanged."""
        if model_name not in self.catalog.models:
            raise UsageError(f"unknown model {model_name!r} (known: {', '.join(sorted(self.catalog.models))})")
        model = self.catalog.models[model_name]
        host = self.catalog.model_host(model_name)
        serving = self.store.serving(host.name)
        spec = self.spec_for(model)
        if serving is not None and serving.spec.model == model_name and not force:
            # Compare against what serves, in its staged directory: an unpinned branch is not
            # re-resolved here (no network for a no-op); --force does that.
            same = self.spec_for(model, model_dir=serving.spec.model_dir, revision=serving.spec.revision)
            if same.unit_sha == serving.spec.unit_sha and self.is_healthy(serving):
                return None
        previous = serving.revision if serving is not None else None
        return self.store.create(host.name, spec, trigger or default_trigger(), previous,
                                 self.ports_for(host.name).clock.now(), no_rollback=no_rollback)

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
        if target.phase is not Phase.ACTIVE:
            raise UsageError(f"host {host_name}: revision {to_revision} ({target.model}) never became "
                             f"active (outcome {target.phase.value}); roll back to one that did")
        return self.store.create(host_name, target.spec, f"{trigger}:to-{to_revision}",
                                 serving.revision if serving else None,
                                 self.ports_for(host_name).clock.now(), no_rollback=no_rollback)

    def is_healthy(self, dep: Deployment) -> bool:
        try:
            ports = self.ports_for(dep.host)  # builds the host's connection on first use: may fail too
            if not ports.systemd.unit_state(dep.spec.unit_name).is_active:
                return False
            ok, _ = ports.health.health(dep.spec.base_url)
            return ok and dep.spec.served_name in ports.health.models(dep.spec.base_url)
        except OrchestratorError:
            return False

    # -- running ------------------------------------------------------------------------------
    def run(self, dep_id: int) -> Deployment:
        """Drive a deployment until it ends (or parks on SIGTERM); returns its final record."""
        dep = self.store.get(dep_id)
        ports = self.ports_for(dep.host)
        bound = {"deployment_id": dep.id, "host": dep.host, "revision": dep.revision}
        blog = log.bind(**bound)
        ctx = StepContext(ports=ports, defaults=self.catalog.defaults, progress=self.progress,
                          managed_units=self._managed_units(dep.host), bound=bound, park=self.park)
        while not is_terminal(dep.phase):
            if self.before_step is not None:
                self.before_step(dep)  # test hook: pause or park at a named phase
            if self.park.is_set():
                blog.info("deployment_parked", phase=dep.phase.value)
                ctx.emit("parked", phase=dep.phase.value)
                return dep
            try:
                event = self._run_step(ctx, dep, blog)
            except steps.Parked:
                blog.info("deployment_parked", phase=dep.phase.value)
                ctx.emit("parked", phase=dep.phase.value)
                return dep
            nxt = advance(dep.phase, event)
            at = ports.clock.now()
            self.store.transition(dep.id, nxt, at)
            self._settle_serving(dep, nxt)
            blog.info("phase_changed", phase=nxt.value, previous=dep.phase.value, on=event.value)
            ctx.emit("phase", phase=nxt.value, model=dep.model)
            dep = self.store.get(dep.id)
        return dep

    def _run_step(self, ctx: StepContext, dep: Deployment, blog: structlog.typing.FilteringBoundLogger) -> Event:
        try:
            if dep.phase is Phase.ROLLING_BACK:
                self._rollback(ctx, dep)
            else:
                self._forward(ctx, dep)
            return Event.OK
        except OrchestratorError as exc:
            if dep.phase is Phase.ROLLING_BACK:
                blog.error("rollback_failed", error=str(exc))
                self.store.record_error(dep.id, rollback_error=str(exc))
                return Event.FAIL
            blog.error("step_failed", phase=dep.phase.value, error=str(exc))
            self.store.record_error(dep.id, error=f"{dep.phase.value}: {exc}")
            can_roll_back = dep.previous_revision is not None and not dep.no_rollback
            return Event.FAIL if can_roll_back else Event.FAIL_NO_ROLLBACK

    def _forward(self, ctx: StepContext, dep: Deployment) -> None:
        spec = dep.spec
        if dep.phase is Phase.PREFLIGHT:
            self._preflight(ctx, dep)
        elif dep.phase is Phase.STAGING:
            self._stage(ctx, dep)
            self._preinstall(ctx, dep)
        elif dep.phase is Phase.STOPPING:
            steps.stop_units(ctx, self._units_to_stop(dep))
        elif dep.phase is Phase.FREEING:
            steps.free_gpus(ctx, spec.gpus, self._units_to_stop(dep))
        elif dep.phase is Phase.INSTALLING:
            steps.install_unit(ctx, spec)
        elif dep.phase is Phase.STARTING:
            steps.start_unit(ctx, spec)
        elif dep.phase is Phase.CHECKING:
            steps.wait_ready(ctx, spec)
            self._smoke_gate(ctx, dep)
            steps.settle_enablement(ctx, spec.unit_name, ctx.managed_units)

    def _smoke_gate(self, ctx: StepContext, dep: Deployment) -> None:
        """Optional smoke benchmark; with a gate, a slower revision fails like a health check."""
        policy, smoke = self.catalog.policy, ctx.ports.smoke
        if not policy.smoke_bench or smoke is None:
            return
        record = smoke.run(dep.spec)
        self.store.record_bench(dep.id, record)
        ctx.emit("smoke_bench", tok_s=record.get("headline_tok_s"))
        new = record.get("headline_tok_s")
        if policy.min_tok_s_ratio is None or dep.previous_revision is None:
            return
        prev = self.store.by_revision(dep.host, dep.previous_revision)
        old = (prev.bench or {}).get("headline_tok_s")
        if old and (new is None or new < policy.min_tok_s_ratio * old):
            raise HealthCheckFailed(
                f"{dep.spec.unit_name}: single-stream {0.0 if new is None else new:.1f} tok/s is below "
                f"{policy.min_tok_s_ratio:g} x {old:.1f} tok/s of revision {prev.revision} ({prev.model})",
                host=dep.host, unit=dep.spec.unit_name)

    def _preflight(self, ctx: StepContext, dep: Deployment) -> None:
        snap = ctx.ports.gpus.snapshot()
        state = ctx.ports.systemd.unit_state(dep.spec.unit_name)
        ctx.emit("preflight", gpus=len(snap.gpus), unit_state=state.active_state)
        missing = sorted(set(dep.spec.gpus) - {g.index for g in snap.gpus})
        if missing:
            raise PlanError(f"{dep.model} needs GPU {','.join(map(str, dep.spec.gpus))} but nvidia-smi shows "
                            f"{len(snap.gpus)} GPU(s): {','.join(str(g.index) for g in snap.gpus) or 'none'}",
                            host=dep.host)
        check_layout(self.catalog, dep, ctx.ports, snap)

    def _stage(self, ctx: StepContext, dep: Deployment) -> None:
        store = ctx.ports.weights
        if dep.spec.source == "none" or store is None:
            return
        staged = store.stage(dep.spec, ctx.progress)
        ctx.emit("staged", path=staged.path, revision=staged.revision, bytes=staged.total_bytes)
        if staged.path != dep.spec.model_dir and not dep.trigger.startswith("rollback"):
            model = self.catalog.models[dep.model]
            self.store.update_spec(dep.id, self.spec_for(model, model_dir=staged.path, revision=staged.revision))
        check_layout(self.catalog, self.store.get(dep.id), ctx.ports, ctx.ports.gpus.snapshot())

    def _preinstall(self, ctx: StepContext, dep: Deployment) -> None:
        """Write and load a unit that is not running yet while the old model still serves: it needs
        no GPU, and it takes a file write and a daemon-reload out of the downtime."""
        spec = self.store.get(dep.id).spec
        sd = ctx.ports.systemd
        if sd.unit_state(spec.unit_name).is_active:
            return
        try:
            steps.install_unit(ctx, spec)
        except SystemdError:
            # An invalid unit is caught before anything stops; leave no broken file behind.
            sd.remove_unit(spec.unit_name)
            sd.daemon_reload()
            raise

    def _rollback(self, ctx: StepContext, dep: Deployment) -> None:
        assert dep.previous_revision is not None  # the table only enters rolling_back with one
        prev = self.store.by_revision(dep.host, dep.previous_revision).spec
        ctx.emit("rollback", to_revision=dep.previous_revision, model=prev.model)
        units = self._units_to_stop(dep) | {dep.spec.unit_name}
        steps.stop_units(ctx, units - {prev.unit_name} if prev.unit_name != dep.spec.unit_name else units)
        steps.free_gpus(ctx, prev.gpus, units - {prev.unit_name})
        steps.install_unit(ctx, prev)
        steps.start_unit(ctx, prev)
        steps.wait_ready(ctx, prev)
        steps.settle_enablement(ctx, prev.unit_name, ctx.managed_units | {dep.spec.unit_name})

    # -- helpers ------------------------------------------------------------------------------
    def _managed_units(self, host: str) -> frozenset[str]:
        units = {self.catalog.models[m].unit_name for m in self.catalog.models_on(host)}
        units |= {d.spec.unit_name for d in self.store.history(host, limit=20)}
        return frozenset(units)

    def _units_to_stop(self, dep: Deployment) -> frozenset[str]:
        """The recorded serving unit, the target itself (redeploy), and any managed unit on our GPUs."""
        units = {dep.spec.unit_name}
        if dep.previous_revision is not None:
            units.add(self.store.by_revision(dep.host, dep.previous_revision).spec.unit_name)
        wanted = set(dep.spec.gpus)
        for name in self.catalog.models_on(dep.host):
            if wanted & set(self.catalog.models[name].gpus):
                units.add(self.catalog.models[name].unit_name)
        return frozenset(units)

    def _settle_serving(self, dep: Deployment, phase: Phase) -> None:
        # The serving pointer moves only on outcomes: a rollback that succeeds leaves it where it
        # was (the previous revision); a failed one means nothing is known to serve.
        if phase is Phase.ACTIVE:
            self.store.set_serving(dep.host, dep.revision)
        elif phase is Phase.FAILED:
            self.store.set_serving(dep.host, None)
