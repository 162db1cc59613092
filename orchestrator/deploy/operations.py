"""Operations: what the CLI (in-process) and the agent (over its socket) both run.

Each operation takes the host's lock, so a second switch on a busy host is refused with the
running deployment named, whether it was started by another CLI or by the agent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.adapters.residency_store import SqliteResidencyStore
from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.core import schedule as sched
from orchestrator.core.catalog import Catalog
from orchestrator.core.proxy import Mode
from orchestrator.core.records import Deployment, ServingChange
from orchestrator.core.resident import ASLEEP, STOPPED
from orchestrator.core.secrets import redact_tree
from orchestrator.deploy import actions, multinode
from orchestrator.deploy.context import StepContext
from orchestrator.deploy.engine import Engine, default_trigger
from orchestrator.deploy.locks import host_held, host_lock
from orchestrator.deploy.warm_steps import sleeper_mib
from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.ports import HostPorts, ProgressCallback, ResidencyStore, StateStore


class Operations:
    def __init__(self, catalog: Catalog, ports_for: Callable[[str], HostPorts], *,
                 store: StateStore | None = None, template: str | None = None,
                 residency: ResidencyStore | None = None,
                 before_step: Callable[[Deployment], None] | None = None) -> None:
        self.catalog = catalog
        self.state_dir = catalog.state_dir
        # The stores open on first use: building the operations writes nothing, so a request refused
        # before it needs a record (two models that cannot serve together) leaves no state dir behind.
        self._store = store
        self._residency_store = residency
        self._open_lock = threading.Lock()  # the agent's threads share one store of each
        self.ports_for = ports_for
        self.template = template
        self.before_step = before_step
        # The engines of operations in flight, for SIGTERM; each leaves when its operation ends
        # (a list of every engine ever built grew with each operation for the agent's lifetime).
        self.engines: set[Engine] = set()
        self._engines_lock = threading.Lock()

    @property
    def store(self) -> StateStore:
        with self._open_lock:
            if self._store is None:
                self._store = SqliteStore(Path(self.catalog.state_dir) / "state.db", group=self.catalog.socket_group)
            return self._store

    @property
    def residency(self) -> ResidencyStore:
        """Warm switches: which models sleep (a file of its own beside state.db)."""
        with self._open_lock:
            if self._residency_store is None:
                self._residency_store = SqliteResidencyStore(Path(self.catalog.state_dir) / "residency.db",
                                                             group=self.catalog.socket_group)
            return self._residency_store

    def engine(self, progress: ProgressCallback | None = None) -> Engine:
        """An engine for lookups and planning; ``running`` is the one for an operation that runs steps."""
        return Engine(self.catalog, self.store, self.ports_for, residency=self.residency, template=self.template, progress=progress,
                      before_step=self.before_step)

    @contextmanager
    def running(self, progress: ProgressCallback | None = None) -> Iterator[Engine]:
        """An engine that ``park_all`` reaches while the block runs, and forgets after it."""
        eng = self.engine(progress)
        with self._engines_lock:
            self.engines.add(eng)
        try:
            yield eng
        finally:
            with self._engines_lock:
                self.engines.discard(eng)

    def park_all(self) -> None:
        """SIGTERM: every running engine finishes its step, persists, and stops."""
        with self._engines_lock:
            for eng in self.engines:
                eng.park.set()

    # -- lookups callers use instead of the catalog or the store ------------------------------------
    def holder(self, host: str) -> str:
        """What holds the host now, for a Busy message."""
        running = self.store.unfinished(host)
        if not running:
            return "another operation is running"
        d = running[-1]
        return f"deployment #{d.id} (revision {d.revision}, {d.model}, {d.trigger}) is in phase {d.phase.value}"

    # Callers written before Catalog.target (the one way from names to a Host) still say these.
    def host_of(self, model: str) -> str:
        return self.catalog.target(model=model).name

    def resolve_host(self, host: str | None) -> str:
        return self.catalog.target(host=host).name

    def serving(self, host: str | None) -> Deployment | None:
        """The deployment recorded as serving on the host (the only host when left out)."""
        return self.store.serving(self.catalog.target(host=host).name)

    def unfinished(self, host: str) -> list[Deployment]:
        return self.store.unfinished(host)

    def record_event(self, at: float, host: str | None, kind: str, detail: dict[str, Any]) -> None:
        self.store.record_event(at, host, kind, redact_tree(detail))  # loop failures quote outside text

    def events(self, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        return self.store.events(kind=kind, limit=limit)

    def record_bench(self, dep_id: int, record: dict[str, Any]) -> None:
        self.store.record_bench(dep_id, record)

    def deployments(self, host: str, limit: int = 50) -> list[Deployment]:
        """The host's deployment records, newest first (history as records, for applications)."""
        return self.store.history(self.catalog.target(host=host).name, limit)

    def stop_serving(self, host: str, *, reason: str) -> None:
        """Stop what serves on the host and leave nothing serving (the unit stopped and disabled, the
        pointer cleared, an event naming why): undoing a first deployment has no revision to go to."""
        serving = self.serving(host)
        if serving is None:
            return
        with host_lock(self.state_dir, host, self.holder(host)):
            sd = self.ports_for(host).systemd
            sd.stop(serving.spec.unit_name)
            sd.disable(serving.spec.unit_name)
            self.store.move_serving(ServingChange(pointers=((host, None),)))
            self.residency.set_state(host, serving.model, STOPPED, time.time(), unit=serving.spec.unit_name)
            self.store.record_event(time.time(), host, "stopped", {"unit": serving.spec.unit_name,
                                                                   "revision": serving.revision, "reason": reason})

    def benchmarks(self, host: str | None) -> list[Deployment]:
        """The latest benchmarked deployment of each model on the host, newest first."""
        latest: dict[str, Deployment] = {}
        for dep in self.store.history(self.catalog.target(host=host).name, limit=1000):
            if dep.bench and dep.model not in latest:
                latest[dep.model] = dep
        return list(latest.values())

    def probe(self, host: str) -> tuple[Deployment | None, bool]:
        """(what serves, is it healthy); raises TransportError when the host cannot be reached, so
        the watch can tell "down" from "cannot look" (is_healthy folds both into False)."""
        serving = self.store.serving(host)
        if serving is None:
            return None, True
        self.ports_for(host).systemd.unit_state(serving.spec.unit_name)
        eng = Engine(self.catalog, self.store, self.ports_for, residency=self.residency, template=self.template)
        return serving, eng.is_healthy(serving)

    def schedules(self, now: float, next_runs: dict[str, float] | None = None) -> list[dict[str, Any]]:
        """Each schedule with its next firing time and the last thing it did."""
        events = [e for e in self.store.events(limit=500) if e.get("schedule")]
        rows = []
        for name, s in self.catalog.schedules.items():
            # the next run that acts: firings outside the window are skipped, so they are not shown
            first = next_runs.get(name) if next_runs is not None else sched.next_run(s, now)
            nxt = None if first is None else sched.next_run_in_window(s, first)
            last = next((e for e in events if e["schedule"] == name), None)
            shown = ("never: its cron has no fire time left" if first is None
                     else "never: no firing of its cron falls inside its window" if nxt is None
                     else time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(nxt)))
            rows.append({"name": name, "cron": s.cron, "action": s.action, "model": s.model, "window": s.window,
                         "next_run": shown, "next_run_ts": nxt, "last": last})
        return rows

    # -- operations ---------------------------------------------------------------------------
    @contextmanager
    def _model_locks(self, model: str) -> Iterator[None]:
        """The lock of every host a model runs on (a multi-node model switches all its nodes)."""
        with ExitStack() as stack:
            for node in self.catalog.nodes_of(model):
                stack.enter_context(host_lock(self.state_dir, node.name, self.holder(node.name)))
            yield

    def switch(self, model: str, *, trigger: str | None = None, no_rollback: bool = False, force: bool = False,
               progress: ProgressCallback | None = None,
               abandon: Callable[[], str | None] | None = None) -> dict[str, Any]:
        """Switch to ``model``; ``abandon`` (models on demand): asked while it cold-starts, a reason
        fails the switch (Abandoned) so that it rolls back."""
        host = self.catalog.target(model=model).name
        with self._model_locks(model), self.running(progress) as eng:
            eng.abandon = abandon
            recovered = self._recover_host(eng, host)
            dep = eng.plan_switch(model, trigger=trigger or default_trigger(), no_rollback=no_rollback, force=force)
            if dep is None:
                serving = self.store.serving(host)
                assert serving is not None
                return {"noop": True, "host": host, "model": model, "revision": serving.revision,
                        "message": f"{model} is already active and healthy on {host} (revision "
                                   f"{serving.revision}); nothing to do (use --force to redeploy)"}
            final = eng.run(dep.id)
            return {"noop": False, "recovered": recovered, **final.to_dict()}

    def rollback(self, host: str | None = None, to_revision: int | None = None, *, trigger: str = "rollback",
                 progress: ProgressCallback | None = None) -> dict[str, Any]:
        host = self.catalog.target(host=host).name
        with host_lock(self.state_dir, host, self.holder(host)), self.running(progress) as eng:
            recovered = self._recover_host(eng, host)
            if self.catalog.proxy.enabled:
                return {"recovered": recovered, **self._rollback_set(eng, host, to_revision, trigger)}
            dep = eng.plan_rollback(host, to_revision, trigger=trigger)
            return {"noop": False, "recovered": recovered, **eng.run(dep.id).to_dict()}

    # -- with the front proxy: a set of models per host ------------------------------------------
    def _rollback_set(self, eng: Engine, host: str, to_revision: int | None, trigger: str) -> dict[str, Any]:
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
            dep = eng.plan_spec(host, self.store.by_revision(host, revision).spec, f"{trigger}:to-{revision}",
                                restores=revision)
            result = {"noop": False, **eng.run(dep.id).to_dict()}
            if result["outcome"] != "active":
                break
        return result

    def stop(self, model: str, *, progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Stop MODEL and free its GPUs; with the proxy, its route goes first (then a 404)."""
        host = self.catalog.target(model=model).name
        with self._model_locks(model), self.running(progress) as eng:  # a multi-node model stops on every node
            self._recover_host(eng, host)
            serving = self.store.serving_set(host) if self.catalog.proxy.enabled else \
                [d for d in [self.store.serving(host)] if d is not None]
            dep = next((d for d in serving if d.model == model), None)
            if dep is None:
                raise UsageError(f"{model} does not serve on {host}: nothing to stop "
                                 f"(serving: {', '.join(d.model for d in serving) or 'nothing'})")
            return self._stop(eng, host, dep)

    def _stop(self, eng: Engine, host: str, dep: Deployment) -> dict[str, Any]:
        ports = self.ports_for(host)
        ctx = StepContext(ports=ports, catalog=self.catalog, progress=eng.progress,
                          bound={"host": host, "revision": dep.revision}, residency=self.residency)
        if self.catalog.proxy.enabled:
            rest = [d for d in self.store.serving_set(host) if d.revision != dep.revision]
            actions.route(ctx, [d.spec for d in rest])
            actions.drain(ctx, [dep.spec])
        actions.stop_units(ctx, [dep.spec.unit_name])
        actions.free_gpus(ctx, dep.spec.gpus, [dep.spec.unit_name], sleepers=sleeper_mib(ctx, but=[dep.model]))
        if ports.systemd.unit_state(dep.spec.unit_name).exists:
            ports.systemd.disable(dep.spec.unit_name)
        if dep.spec.nodes:  # then its other units, in reverse start order, on every node
            ctx.node_ctx = lambda h: StepContext(ports=self.ports_for(h), catalog=self.catalog, progress=eng.progress,
                                                 bound={"host": h, "revision": dep.revision})
            units: dict[str, set[str]] = {}
            for node in reversed(dep.spec.nodes):
                units.setdefault(node.host, set()).add(node.unit_name)
            multinode.stop(ctx, {h: frozenset(u) for h, u in units.items()})
            multinode.free(ctx, dep.spec, {h: frozenset(u) for h, u in units.items()})
            for node in dep.spec.nodes:
                if self.ports_for(node.host).systemd.unit_state(node.unit_name).exists:
                    self.ports_for(node.host).systemd.disable(node.unit_name)
        current = self.store.serving(host)
        # the set and the pointer in one transaction: a crash between them left `status` naming a stopped model
        self.store.move_serving(ServingChange(
            pointers=((host, None),) if current is not None and current.revision == dep.revision else (),
            sets=((host, tuple(d.revision for d in rest)),) if self.catalog.proxy.enabled else ()))
        self.residency.set_state(host, dep.model, STOPPED, ports.clock.now(), unit=dep.spec.unit_name)
        self.store.record_event(ports.clock.now(), host, "stop", {"model": dep.model, "revision": dep.revision})
        return {"host": host, "model": dep.model, "revision": dep.revision, "outcome": "stopped",
                "serving": [d.model for d in self.store.serving_set(host)]}

    def explain(self, model: str) -> dict[str, Any]:
        """What a switch to MODEL would do to the host's serving set, and why (no I/O on the host)."""
        host = self.catalog.target(model=model).name
        eng = Engine(self.catalog, self.store, self.ports_for, residency=self.residency, template=self.template)
        spec = eng.spec_for(self.catalog.models[model])
        if not self.catalog.proxy.enabled:
            serving = self.store.serving(host)
            return {"host": host, "model": model, "mode": Mode.STOP_START.value, "displaced": [
                serving.model] if serving else [], "reason": "no front proxy ([proxy] enabled = false): the "
                "serving model stops before the new one starts; clients see connection errors meanwhile",
                "asleep": self._sleepers(host)}
        plan = eng.explain(host, spec)
        return {"host": host, "model": model, "mode": plan.mode.value, "reason": plan.reason,
                "displaced": [self.store.by_revision(host, r).model for r in plan.displaced],
                "asleep": self._sleepers(host)}

    def _sleepers(self, host: str) -> list[dict[str, object]]:
        """The host's recorded sleepers, least recently served first (the order `plan` evicts in)."""
        asleep = [r for r in self.residency.residency(host).values() if r.state == ASLEEP]
        asleep.sort(key=lambda r: (r.last_served is not None, r.last_served or 0.0))
        return [r.to_dict() for r in asleep]

    def stage(self, model: str, *, peer: dict[str, Any] | None = None,
              progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Download and verify a model's weights while whatever serves keeps serving; ``peer``: copy
        them from that box instead (a fleet rollout's one download per fleet, adapters/weights_peer.py)."""
        host = self.catalog.target(model=model).name
        ports = self.ports_for(host)
        if ports.weights is None:
            raise UsageError(f"host {host} has no weight store configured")
        weights = ports.weights
        with host_lock(self.state_dir, f"{host}.stage", f"model weights are already being staged on {host}"):
            spec = self.engine(progress).spec_for(self.catalog.models[model])
            if peer is not None:
                from orchestrator.adapters.weights_peer import with_peer

                weights, source = with_peer(ports.weights, peer)
                spec = replace(spec, source=source)
            staged = weights.stage(spec, progress or (lambda e, f: None))
        return {"model": model, "host": host, "path": staged.path, "revision": staged.revision,
                "bytes": staged.total_bytes}

    def recover(self, host: str | None = None, progress: ProgressCallback | None = None) -> list[dict[str, Any]]:
        """Drive every unfinished deployment (a crash, a parked SIGTERM) to an outcome."""
        out: list[dict[str, Any]] = []
        for name in [self.catalog.host(host).name] if host else list(self.catalog.hosts):
            with host_lock(self.state_dir, name, self.holder(name)), self.running(progress) as eng:
                out += self._recover_host(eng, name)
        return out

    def _recover_host(self, eng: Engine, host: str) -> list[dict[str, Any]]:
        return [eng.run(d.id).to_dict() for d in self.store.unfinished(host)]

    def _node_states(self, dep: Deployment, probe: bool) -> list[dict[str, Any]]:
        """Each unit of a multi-node model: its host, role and (probed) systemd state."""
        rows = [(n.host, n.role + (f" rank {n.rank}" if n.role == "headless" else ""), n.unit_name)
                for n in dep.spec.nodes]
        rows.append((dep.host, "engine (API)" if dep.spec.backend == "ray" else "rank 0 (API)", dep.spec.unit_name))
        out = []
        for host, role, unit in rows:
            row: dict[str, Any] = {"host": host, "role": role, "unit": unit, "state": "not probed"}
            if probe:
                try:
                    seen = self.ports_for(host).systemd.unit_state(unit)
                    # Restarts systemd made on its own since the unit's start: a rank that came back alone.
                    row |= {"state": seen.active_state, "restarts": seen.n_restarts}
                except OrchestratorError as exc:
                    row["state"] = f"unreachable: {exc}"
            out.append(row)
        return out

    def _rank_of(self, host: str) -> list[dict[str, Any]]:
        """The multi-node models headed elsewhere that have a unit on ``host`` (its own record says nothing)."""
        out = []
        for head in self.catalog.hosts:
            dep = self.store.serving(head) if head != host else None
            if dep is not None and host in dep.spec.node_hosts:
                out.append({"model": dep.model, "head": head, "revision": dep.revision,
                            "units": [n.unit_name for n in dep.spec.nodes if n.host == host]})
        return out

    def history(self, host: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        if host is not None:
            self.catalog.host(host)
        out = []
        eng = Engine(self.catalog, self.store, self.ports_for, residency=self.residency, template=self.template)
        # Models on demand: the requests each on-demand switch served and their waits (agent/demand.py).
        demand = {e.get("deployment_id"): e for e in reversed(self.store.events(host=host, kind="demand", limit=500))}
        for d in self.store.history(host, limit):
            row, plan = d.to_dict(), self.store.plan_of(d.id)
            if d.id in demand:
                row["demand"] = {k: demand[d.id].get(k) for k in ("requests", "cancelled", "cold", "waits_s",
                                                                  "wait_max_s")}
            if d.spec.nodes:  # what it did on each node, as persisted while it ran
                row["node_progress"] = [{k: e.get(k) for k in ("phase", "step", "node", "unit", "at")}
                                        for e in eng.node_progress(d)]
            if plan is not None:
                kept = [r for r in plan["before"] if r not in plan["displaced"]]
                row["plan"] = {"mode": plan["mode"], "reason": plan["reason"],
                               "set_after": sorted(self.store.by_revision(d.host, r).model
                                                   for r in [*kept, d.revision])}
            out.append(row)
        return out

    def _residency(self, host: str, probe: bool) -> dict[str, Any]:
        """Warm switches: each model serving, asleep (level) or stopped, the host RAM sleepers hold,
        and (probed) each GPU's memory by process, with the model whose unit it belongs to."""
        records = self.residency.residency(host)
        h = self.catalog.hosts[host]
        models = []
        for name in self.catalog.models_on(host):
            rec = records.get(name)
            models.append({"model": name, "state": rec.state if rec else "stopped", "level": rec.level if rec else None,
                           "since": rec.since if rec else None, "last_served": rec.last_served if rec else None,
                           "ram_gib": round(rec.ram_gib, 3) if rec else 0.0})
        out: dict[str, Any] = {"models": models, "sleep_ram_gib": round(sum(r.ram_gib for r in records.values()), 3),
                               "ram_budget_gib": h.sleep_ram_budget(), "residue_gib": h.sleep_residue_gib}
        if probe:
            try:
                ports = self.ports_for(host)
                for m in models:  # observed: a record of a unit stopped since (a reboot, systemctl) is stale
                    if m["state"] != "stopped" and not ports.systemd.unit_state(
                            self.catalog.models[str(m["model"])].unit_name).is_active:
                        m.update(state="stopped", level=None, ram_gib=0.0)
                owner = {pid: n for n in self.catalog.models_on(host)
                         for pid in ports.systemd.cgroup_pids(self.catalog.models[n].unit_name)}
                snap = ports.gpus.snapshot()
                out["gpus"] = [{"index": g.index, "used_mib": g.memory_used_mib, "total_mib": g.memory_total_mib,
                                "processes": [{"pid": p.pid, "mib": p.used_memory_mib, "model": owner.get(p.pid),
                                               "state": records[owner[p.pid]].state
                                               if owner.get(p.pid) in records else None}
                                              for p in snap.processes if p.gpu_index == g.index]}
                               for g in snap.gpus]
            except OrchestratorError as exc:
                out["gpus_error"] = str(exc)
        return out

    def status(self, host: str | None = None, probe: bool = True) -> dict[str, Any]:
        hosts = [self.catalog.host(host).name] if host else list(self.catalog.hosts)
        out: dict[str, Any] = {"at": time.time(), "hosts": {}}
        for name in hosts:
            serving = self.store.serving(name)
            running = self.store.unfinished(name)
            entry: dict[str, Any] = {
                "serving": None if serving is None else {"revision": serving.revision, "model": serving.model,
                                                         "unit": serving.spec.unit_name,
                                                         "url": serving.spec.base_url},
                "running": [{"id": d.id, "revision": d.revision, "model": d.model, "phase": d.phase.value,
                             "trigger": d.trigger} for d in running],
                # unfinished while nothing holds the host: interrupted (Ctrl-C, a crash), not running
                **({"interrupted": True} if running and host_held(self.state_dir, name) is False else {}),
            }
            eng = Engine(self.catalog, self.store, self.ports_for, residency=self.residency, template=self.template)
            if probe and serving is not None:
                entry["serving"]["healthy"] = eng.is_healthy(serving)
            if self.catalog.proxy.enabled:
                cfg, h = self.catalog.proxy, self.catalog.hosts[name]
                bind = cfg.bind or h.bind or h.address
                where = h.address if bind in ("0.0.0.0", "::") else bind
                entry["endpoint"] = f"http://{f'[{where}]' if ':' in where else where}:{cfg.port}/v1"
                entry["models"] = [{"revision": d.revision, "model": d.model, "served_name": d.spec.served_name,
                                    "gpus": list(d.spec.gpus), "unit": d.spec.unit_name, "url": d.spec.base_url,
                                    **({"healthy": eng.is_healthy(d)} if probe else {})}
                                   for d in self.store.serving_set(name)]
            if serving is not None and serving.spec.nodes:
                entry["serving"]["nodes"] = self._node_states(serving, probe)
            if ranks := self._rank_of(name):
                entry["node_of"] = ranks
            if any(self.catalog.models[m].sleep for m in self.catalog.models_on(name)):
                entry["residency"] = self._residency(name, probe)
            out["hosts"][name] = entry
        return out
