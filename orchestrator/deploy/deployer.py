"""The deployer: drives deployments through the state machine, one step at a time (the one module that
moves a deployment: it alone calls core/states.py's advance() and the store's transition()).

Each phase change is written to the store before the next step runs. Running a deployment that
was interrupted (a crash, SIGTERM) re-runs the step it was in: steps are idempotent. Any failure
from ``stopping`` on brings the previous stable revision back, once; a failed rollback is final.
Planning (what a switch or rollback deploys, and whether it is needed) is deploy/planning.py's
``Planner``, which ``Deployer`` extends; what a step is given is read by deploy/step_inputs.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

from orchestrator import logs
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import NO_CHANGE, Deployment, Mode, ServingChange, UnitSpec
from orchestrator.core.states import (
    ABANDONABLE,
    DECIDING,
    Event,
    Phase,
    Serves,
    advance,
    failed,
    is_terminal,
    moves_serving,
    reported,
)
from orchestrator.deploy import actions, serving_set, step_inputs
from orchestrator.deploy.context import Parked, StepContext, StepInput
from orchestrator.deploy.planning import Planner
from orchestrator.deploy.read_once import read_once
from orchestrator.deploy.step_inputs import PortsFactory
from orchestrator.deploy.steps import STEPS
from orchestrator.errors import OrchestratorError, SmokeGateFailed
from orchestrator.ports import ProgressCallback, ResidencyStore, StateStore
from orchestrator.secrets import redact, redact_tree

log = logs.get_logger()

StepHook = Callable[[Deployment], None]


def record_running(
    store: StateStore, host: str, spec: UnitSpec, trigger: str, now: float, *, in_set: bool
) -> Deployment:
    """Record what already runs (an adoption) as a revision: created planned, then moved by the table's
    ``adopted`` event to active, the host's serving revision (and, with the front proxy, ``in_set``: in
    its serving set beside what serves there)."""
    previous = store.serving(host)
    dep = store.create(host, spec, trigger, previous.revision if previous else None, now)
    store.transition(
        dep.id, advance(dep.phase, Event.ADOPTED), now, serving_set.joined(store, host, dep.revision, in_set=in_set)
    )
    return store.get(dep.id)


class Deployer(Planner):
    """Plans a host's deployments (``Planner``) and drives each through core/states.py's table (``run``)."""

    def __init__(
        self,
        catalog: Catalog,
        store: StateStore,
        ports_for: PortsFactory,
        *,
        template: str | None = None,
        progress: ProgressCallback | None = None,
        before_step: StepHook | None = None,
        residency: ResidencyStore | None = None,
    ) -> None:
        super().__init__(catalog, store, ports_for, template=template, residency=residency)
        self.progress: ProgressCallback = progress or (lambda event, fields: None)
        self.before_step = before_step
        # Set by SIGTERM handling: finish the current step, persist, and leave the rest for resume.
        self.park = threading.Event()
        # Models on demand: asked while the target starts and is checked (StepContext.abandon).
        self.abandon: Callable[[], str | None] | None = None

    def run(self, dep_id: int) -> Deployment:
        """Drive a deployment until it ends (or parks on SIGTERM); returns its final record."""
        dep = self.store.get(dep_id)
        ports = self.ports_for(dep.host)
        bound = {"deployment_id": dep.id, "host": dep.host, "revision": dep.revision}
        blog = log.bind(**bound)
        ctx = StepContext(
            ports=ports,
            catalog=self.catalog,
            progress=self.progress,
            managed_units=self._managed_units(dep.host),
            bound=bound,
            park=self.park,
            residency=self.residency,
            access_checked=frozenset((m, d) for h, m, d in self.access_checked if h == dep.host),
        )
        node_ctxs: dict[str, StepContext] = {}

        def node_ctx(host: str) -> StepContext:
            if host not in node_ctxs:
                node_ctxs[host] = StepContext(
                    ports=self.ports_for(host),
                    catalog=self.catalog,
                    progress=self.progress,
                    managed_units=self._managed_units(host),
                    bound={**bound, "node": host},
                    park=self.park,
                )
            return node_ctxs[host]

        ctx.node_ctx = node_ctx
        ctx.record = lambda kind, detail: self.store.record_event(
            ports.clock.now(),
            dep.host,
            kind,
            redact_tree({"deployment_id": dep.id, "revision": dep.revision, "phase": dep.phase.value, **detail}),
        )
        deciding: StepContext | None = None  # preflight and staging share one view of the host (read_once)
        while not is_terminal(dep.phase):
            if self.before_step is not None:
                self.before_step(dep)  # test hook: pause or park at a named phase
            if self.park.is_set():
                return self._parked(ctx, dep, blog)
            deciding = (deciding or read_once(ctx)) if dep.phase in DECIDING else None
            step_ctx = deciding or ctx
            step_ctx.abandon = self.abandon if dep.phase in ABANDONABLE else None
            try:
                event = self._run_step(step_ctx, dep, blog)
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
            ctx.emit(
                "phase",
                phase=nxt.value,
                model=dep.model,
                proxy=plan is not None,
                handover=plan is not None and plan.keeps_serving,
                beside=plan is not None and plan.mode is Mode.BESIDE,
            )
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
        step = StepInput(
            dep=dep,
            previous=step_inputs.previous(self.store, dep),
            units_to_stop=step_inputs.units_to_stop(self.catalog, self.store, dep, plan),
            respec=lambda path, revision: self.spec_for(
                self.catalog.models[dep.model], model_dir=path, revision=revision
            ),
            plan=plan,
            serving=serving,
            node_units_to_stop=step_inputs.node_units_to_stop(self.catalog, self.store, dep),
            peer_restore=self._peer_restore(dep),
            node_progress=self.node_progress(dep),
            warm_progress=self.warm_progress(dep),
        )
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
        return step_inputs.warm_progress(self.store, dep)

    def node_progress(self, dep: Deployment) -> tuple[dict[str, Any], ...]:
        """What the deployment did on each node of a multi-node model, oldest first (deploy/multinode.py)."""
        return step_inputs.node_progress(self.store, dep)

    def _managed_units(self, host: str) -> frozenset[str]:
        return step_inputs.managed_units(self.catalog, self.store, host)

    def _peer_restore(self, dep: Deployment) -> dict[str, UnitSpec]:
        return step_inputs.peer_restore(self.store, dep)

    def _clean_weights(self, ctx: StepContext, dep: Deployment) -> None:
        """Old staged revisions go by policy once the new one serves; never the serving or the
        previous stable one. A failure here is logged: the switch itself has succeeded."""
        store = ctx.ports.weights
        if store is None:
            return
        before = step_inputs.previous(self.store, dep)
        keep = [self.store.get(dep.id).spec] + ([before.spec] if before is not None else [])
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
        return serving_set.outcome(
            dep.host,
            dep.revision,
            target=serves is Serves.TARGET,
            plan=self.plan_of(dep),
            peers=self._peer_restore(dep),
        )
