"""Operations: what the CLI (in-process) and the agent (over its socket) both run.

Each operation takes the host's lock, so a second switch on a busy host is refused with the
running deployment named, whether it was started by another CLI or by the agent (staging takes the
box's stage lock instead: weights download while a model serves). The stores and
lookups they share are in operations_base.py, the read-only views in operations_views.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any

from orchestrator.core.records import Deployment, UnitSpec
from orchestrator.core.resident import ASLEEP, STOPPED
from orchestrator.core.states import Phase
from orchestrator.deploy import actions, multinode, serving_set
from orchestrator.deploy.adopt import stop_processes
from orchestrator.deploy.context import StepContext
from orchestrator.deploy.deployer import Deployer
from orchestrator.deploy.locks import activity_lock, host_lock
from orchestrator.deploy.operations_views import OperationsViews
from orchestrator.deploy.planning import default_template, default_trigger
from orchestrator.deploy.residents import loaded_asleep
from orchestrator.deploy.sleep_stop import stop_and_free
from orchestrator.errors import UsageError
from orchestrator.ports import ProgressCallback


class Operations(OperationsViews):
    """Every operation of the application, and (inherited) the stores, lookups and views they share."""

    def stop_serving(self, host: str, *, reason: str) -> None:
        """Stop what serves on the host and leave nothing serving (the unit stopped and disabled, the
        pointer cleared, an event naming why): undoing a first deployment has no revision to go to."""
        serving = self.serving(host)
        if serving is None:
            return
        with host_lock(self.state_dir, host, self.holder(host)):
            spec, ctx = serving.spec, self.context(host, None)
            proxied = self._unroute(ctx, host, serving.revision, spec)
            stop_and_free(ctx, serving.model, spec.unit_name, spec.gpus, free=False, disable=True)
            serving_set.leave(self.store, host, serving.revision, in_set=proxied)
            self.store.record_event(
                time.time(),
                host,
                "stopped",
                {"unit": serving.spec.unit_name, "revision": serving.revision, "reason": reason},
            )

    def _unroute(self, ctx: StepContext, host: str, revision: int, spec: UnitSpec) -> bool:
        """With the front proxy: route what else serves, then drain ``spec`` (a route to a stopped engine
        answers 502); whether the proxy is on."""
        if not self.catalog.proxy.enabled:
            return False
        actions.route(ctx, [d.spec for d in self.store.serving_set(host) if d.revision != revision])
        actions.drain(ctx, [spec])
        return True

    # -- operations ---------------------------------------------------------------------------
    @contextmanager
    def _model_locks(self, model: str) -> Iterator[None]:
        """The lock of every host a model runs on (a multi-node model switches all its nodes)."""
        with ExitStack() as stack:
            for node in self.catalog.nodes_of(model):
                stack.enter_context(host_lock(self.state_dir, node.name, self.holder(node.name)))
            yield

    def switch(
        self,
        model: str,
        *,
        trigger: str | None = None,
        no_rollback: bool = False,
        force: bool = False,
        progress: ProgressCallback | None = None,
        abandon: Callable[[], str | None] | None = None,
    ) -> dict[str, Any]:
        """Switch to ``model``; ``abandon`` (models on demand): asked while it cold-starts, a reason
        fails the switch (Abandoned) so that it rolls back."""
        host = self.catalog.target(model=model).name
        with self._model_locks(model), self.running(progress) as eng:
            eng.abandon = abandon
            recovered = self._recover_host(eng, host)
            # Before a deployment is recorded: a unit its user cannot run refuses with exit 2, not a rollback.
            # (a level-1 sleeper under this very unit runs already: its wake needs neither; preflight says so too)
            spec = eng.spec_for(self.catalog.models[model])
            if not (self.catalog.proxy.enabled and loaded_asleep(self.ports_for(host), self.catalog, spec)):
                eng.check_access(model)  # once per switch: the deployment's preflight step then skips it
            dep = eng.plan_switch(model, trigger=trigger or default_trigger(), no_rollback=no_rollback, force=force)
            if dep is None:
                serving = self.store.serving(host)
                assert serving is not None
                return {
                    "noop": True,
                    "host": host,
                    "model": model,
                    "revision": serving.revision,
                    "message": f"{model} is already active and healthy on {host} (revision "
                    f"{serving.revision}); nothing to do (use --force to redeploy)",
                }
            final = eng.run(dep.id)
            return {"noop": False, "recovered": recovered, **final.to_dict()}

    def rollback(
        self,
        host: str | None = None,
        to_revision: int | None = None,
        *,
        trigger: str = "rollback",
        progress: ProgressCallback | None = None,
    ) -> dict[str, Any]:
        host = self.catalog.target(host=host).name
        with host_lock(self.state_dir, host, self.holder(host)), self.running(progress) as eng:
            recovered = self._recover_host(eng, host)
            if self.catalog.proxy.enabled:
                return {"recovered": recovered, **self._rollback_set(eng, host, to_revision, trigger)}
            dep = eng.plan_rollback(host, to_revision, trigger=trigger)
            return {"noop": False, "recovered": recovered, **eng.run(dep.id).to_dict()}

    # -- with the front proxy: a set of models per host ------------------------------------------
    def _rollback_set(self, eng: Deployer, host: str, to_revision: int | None, trigger: str) -> dict[str, Any]:
        """Restore the set before the newest switch: redeploy what it displaced, or stop what it added."""
        if to_revision is not None:
            target = self.store.by_revision(host, to_revision)
            dep = eng.plan_spec(host, target.spec, f"{trigger}:to-{to_revision}", restores=to_revision)
            return {"noop": False, **eng.run(dep.id).to_dict()}
        serving = {d.revision for d in self.store.serving_set(host)}
        last = next((d for d in self.store.history(host, 200) if d.revision in serving), None)
        plan = None if last is None else eng.plan_of(last)
        if last is None or plan is None:
            raise UsageError(f"host {host} has no switch to roll back (see `orchestrator history`)")
        if not plan.displaced:
            return {**self._stop(eng, host, last), "noop": False}
        result: dict[str, Any] = {}
        for revision in plan.displaced:
            dep = eng.plan_spec(
                host, self.store.by_revision(host, revision).spec, f"{trigger}:to-{revision}", restores=revision
            )
            final = eng.run(dep.id)
            result = {"noop": False, **final.to_dict()}
            if final.phase is not Phase.ACTIVE:
                break
        return result

    def adopt(self, host: str | None, units: list[str], pids: list[int] | None = None) -> dict[str, Any]:
        """The engines ``host``'s box runs outside the product, each with its deploy.toml entry for
        review (deploy/adopt_record.py); nothing changes."""
        from orchestrator.deploy import adopt_record

        target = self.catalog.target(host=host).name
        return adopt_record.find(self.catalog, self.store, self.ports_for(target), _services(units), pids or [])

    def adopt_record(self, host: str | None, units: list[str], pids: list[int] | None = None) -> dict[str, Any]:
        """Once deploy.toml holds their entries: a revision per found engine recording what runs now."""
        from orchestrator.deploy import adopt_record

        target = self.catalog.target(host=host).name
        with host_lock(self.state_dir, target, self.holder(target)):
            return adopt_record.record(
                self.catalog,
                self.store,
                self.ports_for(target),
                _services(units),
                pids or [],
                self.template or default_template(),
                time.time(),
            )

    def stop(self, model: str, *, progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Stop MODEL and free its GPUs; with the proxy, its route goes first (then a 404)."""
        host = self.catalog.target(model=model).name
        with self._model_locks(model), self.running(progress) as eng:  # a multi-node model stops on every node
            self._recover_host(eng, host)
            serving = (
                self.store.serving_set(host)
                if self.catalog.proxy.enabled
                else [d for d in [self.store.serving(host)] if d is not None]
            )
            dep = next((d for d in serving if d.model == model), None)
            if dep is not None:
                return self._stop(eng, host, dep)
            rec = self.residency.residency(host).get(model)
            if rec is not None and rec.state == ASLEEP:
                return self._stop_sleeper(eng, host, model, rec.unit)
            raise UsageError(
                f"{model} neither serves nor sleeps on {host}: nothing to stop "
                f"(serving: {', '.join(d.model for d in serving) or 'nothing'})"
            )

    def _stop_sleeper(self, eng: Deployer, host: str, model: str, unit: str) -> dict[str, Any]:
        """A sleeping model has no route: its unit stops (its weights leave host RAM), and its GPUs
        are verified free of its processes by PID; the others there (the model that displaced it,
        other sleepers) stay as they are."""
        ctx = self.context(host, eng.progress)
        unit = unit or self.catalog.models[model].unit_name
        stop_and_free(ctx, model, unit, self.catalog.models[model].gpus, others_stay=True, disable=True)
        self.store.record_event(ctx.ports.clock.now(), host, "stop", {"model": model, "unit": unit, "was": ASLEEP})
        return {
            "host": host,
            "model": model,
            "revision": None,
            "outcome": "stopped",
            "was": ASLEEP,
            "serving": [d.model for d in self.store.serving_set(host)],
        }

    def _stop(self, eng: Deployer, host: str, dep: Deployment) -> dict[str, Any]:
        ctx = self.context(host, eng.progress, revision=dep.revision)
        ports = ctx.ports
        self._unroute(ctx, host, dep.revision, dep.spec)
        stop_processes(ctx, [dep.spec])  # an adopted engine started by hand: its process, then the GPUs are read
        # Recorded stopped with the serving set, below: a free that fails leaves it serving, for a retry.
        stop_and_free(ctx, dep.model, dep.spec.unit_name, dep.spec.gpus, disable=True, mark_stopped=False)
        if dep.spec.nodes:  # then its other units, in reverse start order, on every node
            ctx.node_ctx = lambda h: StepContext(
                ports=self.ports_for(h),
                catalog=self.catalog,
                progress=eng.progress,
                bound={"host": h, "revision": dep.revision},
            )
            units: dict[str, set[str]] = {}
            for node in reversed(dep.spec.nodes):
                units.setdefault(node.host, set()).add(node.unit_name)
            multinode.stop(ctx, {h: frozenset(u) for h, u in units.items()})
            multinode.free(ctx, dep.spec, {h: frozenset(u) for h, u in units.items()})
            for node in dep.spec.nodes:
                if self.ports_for(node.host).systemd.unit_state(node.unit_name).exists:
                    self.ports_for(node.host).systemd.disable(node.unit_name)
        serving_set.leave(self.store, host, dep.revision, in_set=self.catalog.proxy.enabled)
        self.residency.set_state(host, dep.model, STOPPED, ports.clock.now(), unit=dep.spec.unit_name)
        self.store.record_event(ports.clock.now(), host, "stop", {"model": dep.model, "revision": dep.revision})
        return {
            "host": host,
            "model": dep.model,
            "revision": dep.revision,
            "outcome": "stopped",
            "serving": [d.model for d in self.store.serving_set(host)],
        }

    def stage(
        self, model: str, *, peer: dict[str, Any] | None = None, progress: ProgressCallback | None = None
    ) -> dict[str, Any]:
        """Download and verify a model's weights while whatever serves keeps serving; ``peer``: copy
        them from that box instead (a fleet rollout's one download per fleet, adapters/weights_peer.py)."""
        host = self.catalog.target(model=model).name
        ports = self.ports_for(host)
        if ports.weights is None:
            raise UsageError(f"host {host} has no weight store configured")
        weights = ports.weights
        with activity_lock(self.state_dir, host, "stage", f"a stage of {model} is running"):
            spec = self.deployer(progress).spec_for(self.catalog.models[model])
            if peer is not None:
                from orchestrator.adapters.weights_peer import with_peer

                weights, source = with_peer(ports.weights, peer)
                spec = replace(spec, source=source)
            staged = weights.stage(spec, progress or (lambda e, f: None))
        return {
            "model": model,
            "host": host,
            "path": staged.path,
            "revision": staged.revision,
            "bytes": staged.total_bytes,
        }

    def recover(self, host: str | None = None, progress: ProgressCallback | None = None) -> list[dict[str, Any]]:
        """Drive every unfinished deployment (a crash, a parked SIGTERM) to an outcome."""
        out: list[dict[str, Any]] = []
        for name in [self.catalog.host(host).name] if host else list(self.catalog.hosts):
            with host_lock(self.state_dir, name, self.holder(name)), self.running(progress) as eng:
                out += self._recover_host(eng, name)
        return out

    def _recover_host(self, eng: Deployer, host: str) -> list[dict[str, Any]]:
        return [eng.run(d.id).to_dict() for d in self.store.unfinished(host)]


def _services(units: list[str]) -> list[str]:
    """Unit names as systemctl reads them: a bare name is a service."""
    return [u if u.endswith(".service") else f"{u}.service" for u in units]
